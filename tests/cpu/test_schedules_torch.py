"""OneCycleLR and ReduceLROnPlateau give torch's learning rates at identical inputs: the same
step counts, the same metric sequence. Both sides are float64 Python arithmetic of the same
formulas, so the tolerance is a few ulps."""
import math

import pytest

torch = pytest.importorskip("torch")

from blueprint.optim import OneCycleLR, ReduceLROnPlateau  # noqa: E402

ULPS = 1e-12


def _torch_optimizer(lr):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


ONE_CYCLE = [
    ("defaults", dict(), dict()),
    ("linear, short warm-up", dict(pct_start=0.1, anneal_strategy="linear"),
     dict(pct_start=0.1, anneal_strategy="linear")),
    ("three phases", dict(three_phase=True, div_factor=10.0, final_div_factor=100.0),
     dict(three_phase=True, div_factor=10.0, final_div_factor=100.0)),
]


@pytest.mark.parametrize("name, ours, theirs", ONE_CYCLE, ids=[c[0] for c in ONE_CYCLE])
def test_one_cycle_matches_torch_at_every_step(name, ours, theirs):
    epochs, steps, peak = 3, 7, 0.4
    optimizer = _torch_optimizer(peak)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=peak, epochs=epochs, steps_per_epoch=steps,
                                                    cycle_momentum=False, **theirs)
    schedule = OneCycleLR(max_lr=peak, **ours)
    for epoch in range(epochs):
        for step in range(steps):
            expected = optimizer.param_groups[0]["lr"]
            ours = schedule.lr_at(epoch, step, steps, 99.0, epochs)
            assert math.isclose(ours, expected, rel_tol=ULPS, abs_tol=1e-15), (epoch, step)
            optimizer.step()
            scheduler.step()


def test_one_cycle_takes_the_optimizer_lr_as_its_peak_and_ends_with_its_cycle():
    assert OneCycleLR().lr_at(0, 0, 10, 0.5, 1) == pytest.approx(0.5 / 25)
    with pytest.raises(ValueError, match="past the cycle"):
        OneCycleLR().lr_at(1, 0, 10, 0.5, 1)


# a metric that falls, stalls, wobbles inside the threshold, falls again and rises
METRICS = [1.0, 0.9, 0.9, 0.89995, 0.9, 0.8, 0.8, 0.8, 0.8, 0.85, 0.7, 0.7, 0.71, 0.7, 0.7, 0.7]
PLATEAU = [
    ("min rel", dict(patience=1, factor=0.5), dict(patience=1, factor=0.5), 1),
    ("max abs with cooldown", dict(monitor="val_accuracy", patience=0, threshold=0.02, threshold_mode="abs",
                                   cooldown=2, factor=0.3), dict(mode="max", patience=0, threshold=0.02,
                                                                 threshold_mode="abs", cooldown=2, factor=0.3), -1),
    ("min_lr floor", dict(patience=0, factor=0.1, min_lr=0.004), dict(patience=0, factor=0.1, min_lr=0.004), 1),
]


@pytest.mark.parametrize("name, ours, theirs, sign", PLATEAU, ids=[c[0] for c in PLATEAU])
def test_plateau_matches_torch_epoch_by_epoch(name, ours, theirs, sign):
    optimizer = _torch_optimizer(0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **theirs)
    schedule = ReduceLROnPlateau(**ours)
    monitor = schedule.monitor_name
    state = schedule.initial_state(0.1)
    cuts = 0
    for epoch, metric in enumerate(METRICS):
        value = sign * metric
        assert schedule.lr_at(epoch, 0, 1, 0.1, len(METRICS), state) == pytest.approx(optimizer.param_groups[0]["lr"],
                                                                                       rel=ULPS)
        before = state["lr"]
        state = schedule.after_epoch(state, {monitor: value})
        scheduler.step(value)
        cuts += state["lr"] != before
    assert cuts >= 2, "the metric sequence should make both sides cut the lr more than once"
