"""Loss / optimizer / scheduler configs: values, validation, repr round trip, schedule formulas."""
import dataclasses
import math

import pytest

import blueprint.optim as optim
from blueprint.optim import (
    SGD, Adam, AdamW, ConstantLR, CosineAnnealingLR, CrossEntropyLoss, MultiStepLR, StepLR,
)

ALL_VALUES = [
    CrossEntropyLoss(),
    CrossEntropyLoss().label_smoothing(0.1),
    SGD(),
    SGD().lr(0.05).momentum(0.9).nesterov(True).weight_decay(5e-4),
    SGD().lr(1).momentum(0.9).dampening(0.1),
    Adam(),
    Adam().lr(3e-4).betas(0.8, 0.99).eps(1e-6).weight_decay(1e-4),
    AdamW(),
    AdamW().weight_decay(0.0),
    AdamW().lr(2e-3).betas(0.9, 0.95).weight_decay(0.05),
    ConstantLR(),
    ConstantLR().base_lr(0.3),
    StepLR().step_size(30),
    StepLR().step_size(3).gamma(0.5).base_lr(0.2).per_batch(True),
    MultiStepLR().milestones([60, 30]).gamma(0.2),
    MultiStepLR().milestones([100]).per_batch(True),
    CosineAnnealingLR(),
    CosineAnnealingLR().warmup(5).eta_min(1e-5).t_max(50).base_lr(0.4).per_batch(False),
]


@pytest.mark.parametrize("value", ALL_VALUES, ids=repr)
def test_repr_is_code_that_evaluates_back_to_an_equal_value(value):
    text = repr(value)
    assert "(" in text and text.split("(")[0] == type(value).__name__
    again = eval(text, vars(optim))
    assert again == value and hash(again) == hash(value) and repr(again) == text


@pytest.mark.parametrize("value", ALL_VALUES, ids=repr)
def test_values_are_frozen(value):
    first_field = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first_field, 0.5)


def test_setters_return_new_values_and_leave_the_original():
    base = SGD()
    tuned = base.lr(0.01).momentum(0.9)
    assert (base.learning_rate, base.momentum_factor) == (0.1, 0.0)
    assert (tuned.learning_rate, tuned.momentum_factor) == (0.01, 0.9)
    assert base != tuned and SGD() == base


def test_repr_examples():
    assert repr(SGD().lr(0.1).momentum(0.9)) == "SGD().lr(0.1).momentum(0.9)"
    assert repr(AdamW()) == "AdamW().lr(0.001)"
    assert repr(StepLR().step_size(30).gamma(0.1)) == "StepLR().step_size(30)"
    assert repr(MultiStepLR().milestones([60, 30])) == "MultiStepLR().milestones([30, 60])"


@pytest.mark.parametrize("config, lr, slots", [
    (SGD(), 0.1, 0),
    (SGD().momentum(0.9), 0.1, 1),
    (Adam(), 1e-3, 2),
    (AdamW(), 1e-3, 2),
])
def test_optimizer_defaults(config, lr, slots):
    assert (config.learning_rate, config.state_slots) == (lr, slots)
    assert config.validate() is config


def test_adam_and_adamw_defaults_match_torch():
    assert (Adam().beta1, Adam().beta2, Adam().epsilon, Adam().weight_decay_factor) == (0.9, 0.999, 1e-8, 0.0)
    assert AdamW().weight_decay_factor == 1e-2
    assert (Adam.decoupled, AdamW.decoupled) == (False, True)
    assert Adam() != AdamW().weight_decay(0.0)


BAD_CONFIGS = [
    (lambda: SGD().lr(-0.1), ValueError, "SGD.lr expects a value >= 0; found -0.1"),
    (lambda: SGD().momentum(-0.5), ValueError, "SGD.momentum expects a value >= 0; found -0.5"),
    (lambda: SGD().weight_decay(-1e-4), ValueError, "SGD.weight_decay expects a value >= 0; found -0.0001"),
    (lambda: SGD().dampening(-1), ValueError, "SGD.dampening"),
    (lambda: SGD().lr(float("nan")), ValueError, "SGD.lr expects a finite number"),
    (lambda: SGD().lr("0.1"), TypeError, "SGD.lr expects a real number; found str"),
    (lambda: SGD().lr(True), TypeError, "found bool"),
    (lambda: SGD().nesterov(1), TypeError, "SGD.nesterov expects True or False"),
    (lambda: SGD().nesterov(True).validate(), ValueError, "needs momentum > 0 and dampening == 0"),
    (lambda: SGD().momentum(0.9).dampening(0.1).nesterov(True).validate(), ValueError, "dampening 0.1"),
    (lambda: Adam().lr(-1e-3), ValueError, "Adam.lr expects a value >= 0"),
    (lambda: Adam().betas(0.9, 1.0), ValueError, "Adam.betas expects a value in [0, 1); found 1.0"),
    (lambda: AdamW().betas(-0.1, 0.999), ValueError, "AdamW.betas"),
    (lambda: Adam().eps(0), ValueError, "Adam.eps expects a value > 0; found 0.0"),
    (lambda: AdamW().weight_decay(-0.01), ValueError, "AdamW.weight_decay expects a value >= 0; found -0.01"),
    (lambda: CrossEntropyLoss().label_smoothing(1.0), ValueError, "label_smoothing expects a value in [0, 1)"),
    (lambda: CrossEntropyLoss().label_smoothing(-0.1), ValueError, "found -0.1"),
    (lambda: StepLR().step_size(0), ValueError, "StepLR.step_size expects an integer >= 1; found 0"),
    (lambda: StepLR().step_size(2.5), TypeError, "StepLR.step_size expects an integer"),
    (lambda: StepLR().gamma(0), ValueError, "StepLR.gamma expects a value > 0"),
    (lambda: StepLR().lr_at(0, 0, 10, 0.1, 5), ValueError, "StepLR has no step size"),
    (lambda: MultiStepLR().lr_at(0, 0, 10, 0.1, 5), ValueError, "MultiStepLR has no milestones"),
    (lambda: MultiStepLR().milestones([3, 3]), ValueError, "distinct"),
    (lambda: MultiStepLR().milestones([-1]), ValueError, "MultiStepLR.milestones expects an integer >= 0"),
    (lambda: CosineAnnealingLR().warmup(-1), ValueError, "CosineAnnealingLR.warmup expects an integer >= 0"),
    (lambda: CosineAnnealingLR().t_max(0), ValueError, "CosineAnnealingLR.t_max expects an integer >= 1"),
    (lambda: CosineAnnealingLR().eta_min(-1e-3), ValueError, "CosineAnnealingLR.eta_min"),
    (lambda: CosineAnnealingLR().warmup(5).lr_at(5, 0, 10, 0.1, 5), ValueError, "no epochs left to anneal"),
    (lambda: CosineAnnealingLR().per_batch("yes"), TypeError, "per_batch expects True or False"),
    (lambda: ConstantLR().lr_at(0, 10, 10, 0.1, 5), ValueError, "0 <= step < steps_per_epoch (10)"),
    (lambda: ConstantLR().lr_at(-1, 0, 10, 0.1, 5), ValueError, "found epoch -1"),
    (lambda: ConstantLR().lr_at(0, 0, 0, 0.1, 5), ValueError, "steps_per_epoch >= 1"),
]


@pytest.mark.parametrize("make, error, fragment", BAD_CONFIGS, ids=[b[2] for b in BAD_CONFIGS])
def test_bad_configurations_raise_with_a_clear_message(make, error, fragment):
    with pytest.raises(error) as info:
        make()
    assert fragment in str(info.value)


def test_nesterov_is_valid_in_any_setter_order():
    assert SGD().nesterov(True).momentum(0.9).validate().use_nesterov


# ---------------------------------------------------------------- schedule formulas (hand-computed)

SPE, EPOCHS = 4, 6  # steps per epoch, total epochs

SCHEDULE_CASES = [
    # (schedule, epoch, step, base, expected)
    (ConstantLR(), 5, 3, 0.1, 0.1),
    (ConstantLR().base_lr(0.5), 0, 0, 0.1, 0.5),
    (StepLR().step_size(2), 1, 3, 1.0, 1.0),
    (StepLR().step_size(2), 2, 0, 1.0, 0.1),
    (StepLR().step_size(2).gamma(0.5), 5, 3, 1.0, 0.25),
    (StepLR().step_size(3).per_batch(True), 0, 2, 1.0, 1.0),        # global batch 2
    (StepLR().step_size(3).per_batch(True), 0, 3, 1.0, 0.1),        # global batch 3
    (StepLR().step_size(3).per_batch(True), 1, 2, 1.0, 0.01),       # global batch 6
    (StepLR().step_size(2).base_lr(2.0), 2, 0, 0.1, 0.2),
    (MultiStepLR().milestones([1, 3]), 0, 3, 1.0, 1.0),
    (MultiStepLR().milestones([1, 3]), 1, 0, 1.0, 0.1),
    (MultiStepLR().milestones([1, 3]), 4, 0, 1.0, 0.01),
    (MultiStepLR().milestones([5]).gamma(0.5).per_batch(True), 1, 1, 1.0, 0.5),   # global batch 5
    (CosineAnnealingLR().per_batch(False), 0, 3, 1.0, 1.0),
    (CosineAnnealingLR().per_batch(False), 3, 0, 1.0, 0.5),                        # t/T = 3/6
    (CosineAnnealingLR().per_batch(False).eta_min(0.2), 3, 0, 1.0, 0.6),
    (CosineAnnealingLR(), 1, 2, 1.0, (1 + math.cos(math.pi * 1.5 / 6)) / 2),      # t = 1 + 2/4 epochs
    (CosineAnnealingLR().t_max(2).per_batch(False), 1, 0, 1.0, 0.5),
    (CosineAnnealingLR().t_max(2).per_batch(False), 2, 0, 1.0, 0.0),
    # warmup 2 epochs per epoch: lr = base*(epoch+1)/2, then cosine over T = 6 - 2 = 4 epochs
    (CosineAnnealingLR().warmup(2).per_batch(False), 0, 0, 1.0, 0.5),
    (CosineAnnealingLR().warmup(2).per_batch(False), 1, 3, 1.0, 1.0),
    (CosineAnnealingLR().warmup(2).per_batch(False), 2, 0, 1.0, 1.0),
    (CosineAnnealingLR().warmup(2).per_batch(False), 4, 0, 1.0, 0.5),
    # warmup 1 epoch per batch: W = 4 batches, lr = base*(u+1)/4; then t = (u-4)/4 epochs of T = 5
    (CosineAnnealingLR().warmup(1), 0, 0, 0.8, 0.2),
    (CosineAnnealingLR().warmup(1), 0, 3, 0.8, 0.8),
    (CosineAnnealingLR().warmup(1), 1, 0, 0.8, 0.8),
    (CosineAnnealingLR().warmup(1), 3, 2, 0.8, 0.4 * (1 + math.cos(math.pi * 2.5 / 5))),
]


@pytest.mark.parametrize("schedule, epoch, step, base, expected", SCHEDULE_CASES,
                         ids=[f"{c[0]!r}@{c[1]}.{c[2]}" for c in SCHEDULE_CASES])
def test_schedule_matches_hand_computed_value(schedule, epoch, step, base, expected):
    got = schedule.lr_at(epoch=epoch, step=step, steps_per_epoch=SPE, base_lr=base, total_epochs=EPOCHS)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_epoch_schedules_ignore_the_step_and_batch_schedules_use_it():
    per_epoch = [StepLR().step_size(1), MultiStepLR().milestones([1]), CosineAnnealingLR().per_batch(False)]
    for schedule in per_epoch:
        assert len({schedule.lr_at(2, s, SPE, 1.0, EPOCHS) for s in range(SPE)}) == 1
    cosine = CosineAnnealingLR()
    assert len({cosine.lr_at(2, s, SPE, 1.0, EPOCHS) for s in range(SPE)}) == SPE


# ---------------------------------------------------------------- against torch.optim.lr_scheduler

def _torch_lrs(make_scheduler, steps: int, base: float):
    torch = pytest.importorskip("torch", reason="torch is the optional oracle for the schedule formulas")
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=base)
    scheduler = make_scheduler(torch.optim.lr_scheduler, optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


TORCH_CASES = [
    (StepLR().step_size(3).gamma(0.5), lambda s, o: s.StepLR(o, step_size=3, gamma=0.5), False),
    (MultiStepLR().milestones([2, 5, 7]), lambda s, o: s.MultiStepLR(o, milestones=[2, 5, 7], gamma=0.1), False),
    (CosineAnnealingLR().per_batch(False).eta_min(0.01),
     lambda s, o: s.CosineAnnealingLR(o, T_max=10, eta_min=0.01), False),
    (CosineAnnealingLR().eta_min(0.01), lambda s, o: s.CosineAnnealingLR(o, T_max=10 * SPE, eta_min=0.01), True),
    (StepLR().step_size(7).per_batch(True), lambda s, o: s.StepLR(o, step_size=7, gamma=0.1), True),
]


@pytest.mark.parametrize("ours, make_torch, per_batch", TORCH_CASES, ids=[repr(c[0]) for c in TORCH_CASES])
def test_schedule_matches_torch(ours, make_torch, per_batch):
    total_epochs, base = 10, 0.4
    steps = total_epochs * SPE if per_batch else total_epochs
    expected = _torch_lrs(make_torch, steps, base)
    if per_batch:
        got = [ours.lr_at(e, s, SPE, base, total_epochs) for e in range(total_epochs) for s in range(SPE)]
    else:
        got = [ours.lr_at(e, 0, SPE, base, total_epochs) for e in range(total_epochs)]
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
