"""PyTorch-style keyword construction: `SGD(lr=0.1, momentum=0.9)` is the builder chain's value.

The table is derived from each config's builder methods (`setter_names`), so a new setter without a
sample argument here fails `test_every_setter_has_a_sample`."""
import pytest

from blueprint import zoo
from blueprint import ConfigError
from blueprint.optim import (SCHEDULES, SGD, Adam, AdamW, CosineAnnealingLR, CrossEntropyLoss, MultiStepLR, StepLR,
                             setter_names)
from blueprint.task import DeepLearningTask

CONFIGS = (CrossEntropyLoss, SGD, Adam, AdamW) + SCHEDULES
# a non-default argument for every setter (a tuple: the setter's several arguments)
SAMPLES = {"label_smoothing": 0.1, "lr": 0.05, "momentum": 0.9, "dampening": 0.1, "nesterov": True,
           "weight_decay": 1e-3, "betas": (0.8, 0.99), "eps": 1e-6, "base_lr": 0.3, "step_size": 5, "gamma": 0.5,
           "per_batch": True, "milestones": [7, 3], "warmup": 2, "eta_min": 1e-4, "t_max": 10, "max_lr": 0.3,
           "pct_start": 0.2, "anneal_strategy": "linear", "div_factor": 10.0, "final_div_factor": 100.0,
           "three_phase": True, "monitor": "val_accuracy", "mode": "max", "factor": 0.5, "patience": 3,
           "threshold": 1e-3, "threshold_mode": "abs", "cooldown": 2, "min_lr": 1e-5}
OVERRIDES = {(CosineAnnealingLR, "per_batch"): False}    # its default is per batch
CASES = [(cls, name) for cls in CONFIGS for name in setter_names(cls)]


def sample(cls, name):
    return OVERRIDES.get((cls, name), SAMPLES.get(name))


def call_setter(value, name, argument):
    return getattr(value, name)(*(argument if isinstance(argument, tuple) else (argument,)))


def test_every_setter_has_a_sample():
    assert [f"{cls.__name__}.{name}" for cls, name in CASES if sample(cls, name) is None] == []
    assert setter_names(SGD) == ("lr", "momentum", "dampening", "nesterov", "weight_decay")


@pytest.mark.parametrize("cls, name", CASES, ids=lambda c: getattr(c, "__name__", c))
def test_one_keyword_equals_the_setter(cls, name):
    built = call_setter(cls(), name, sample(cls, name))
    assert built != cls()                                     # the sample changes the value
    keyword = cls(**{name: sample(cls, name)})
    assert keyword == built and repr(keyword) == repr(built) and hash(keyword) == hash(built)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_all_keywords_together_equal_the_chain(cls):
    chain = cls()
    for name in setter_names(cls):
        chain = call_setter(chain, name, sample(cls, name))
    keyword = cls(**{name: sample(cls, name) for name in setter_names(cls)})
    assert keyword == chain and repr(keyword) == repr(chain)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_an_unknown_keyword_lists_the_accepted_ones(cls):
    with pytest.raises(TypeError, match="unexpected keyword argument 'params'") as error:
        cls(params=[])
    assert f"accepted keywords: {', '.join(setter_names(cls))}." in str(error.value)


def test_positional_arguments_are_refused_with_the_keyword_form():
    with pytest.raises(TypeError, match=r"keyword arguments only.*SGD\(lr=\.\.\.\).*do not pass them"):
        SGD([1.0], lr=0.1)


@pytest.mark.parametrize("call, setter_call", [
    (lambda: SGD(lr=-1), lambda: SGD().lr(-1)),
    (lambda: Adam(betas=(0.9, 1.0)), lambda: Adam().betas(0.9, 1.0)),
    (lambda: MultiStepLR(milestones=[2, 2]), lambda: MultiStepLR().milestones([2, 2])),
])
def test_keywords_are_validated_by_the_setters(call, setter_call):
    with pytest.raises(ValueError) as by_keyword:
        call()
    with pytest.raises(ValueError) as by_setter:
        setter_call()
    assert str(by_keyword.value) == str(by_setter.value)


TASK_SAMPLES = {"model": zoo.small_cnn(), "loss": CrossEntropyLoss(label_smoothing=0.1), "optimizer": SGD(lr=0.2),
                "scheduler": StepLR(step_size=2), "epochs": 3, "device": "cuda", "amp": True, "fuse": True, "seed": 7,
                "drop_last": True, "progress": False, "log": "h.jsonl", "checkpoint": "c.safetensors"}


def test_task_keywords_equal_the_chain():
    from blueprint.task._task import TASK_KEYWORDS
    assert set(TASK_KEYWORDS) == set(TASK_SAMPLES)
    chain = DeepLearningTask()
    for name in TASK_KEYWORDS:
        chain = getattr(chain, name)(TASK_SAMPLES[name])
    assert DeepLearningTask(**TASK_SAMPLES) == chain and chain != DeepLearningTask()


def test_task_unknown_keyword_points_at_data():
    with pytest.raises(TypeError, match=r"accepted keywords: model, loss, .*\.data\(train="):
        DeepLearningTask(data=None)


def test_device_accepts_cuda_0_and_refuses_other_indices():
    assert DeepLearningTask().device("cuda:0") == DeepLearningTask().device("cuda")
    with pytest.raises(ConfigError, match="only GPU index 0.*CUDA_VISIBLE_DEVICES=1 and pass 'cuda'"):
        DeepLearningTask().device("cuda:1")
    with pytest.raises(ConfigError, match=r"expected one of \('cpu', 'cuda'\)"):
        DeepLearningTask().device("gpu")


@pytest.mark.parametrize("given, found", [(("x", "y"), "tuple"), ([[0]], "list")])
def test_data_given_raw_arrays_says_to_wrap_them(given, found):
    with pytest.raises(TypeError, match=rf"data\(train=...\): expected an ArrayDataset, got {found}; wrap images "
                                        r"\(N, H, W, C\) and labels \(N,\) as ArrayDataset\(x, y\)"):
        DeepLearningTask().data(train=given, batch_size=8)


def test_too_few_logits_for_the_labels_names_the_fc_to_end_with():
    import numpy as np

    from blueprint import BluePrint, conv, fc, gap, seq
    from blueprint.task.data import ArrayDataset

    data = ArrayDataset(np.zeros((6, 4, 4, 1), np.float32), np.arange(6) % 3)
    task = DeepLearningTask().model(BluePrint(seq(conv(4, 3, 1, 1), gap(), fc(2)))).data(train=data, batch_size=2)
    with pytest.raises(ConfigError, match=r"the data has 3 classes but the model outputs 2 logits; end the model "
                                          r"with fc\(3\) \(a zoo model: build it with num_classes=3\)"):
        task._compile()
