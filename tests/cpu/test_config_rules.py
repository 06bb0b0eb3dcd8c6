"""Configuration that does not surprise: a setter changes only what it names, every public setter
says what it does, and two learning rates for one run follow one documented rule with a warning."""
import warnings

import pytest

from blueprint import BluePrint, cbr, fc, gap, seq
from blueprint.optim import SCHEDULES, SGD, Adam, AdamW, CrossEntropyLoss, StepLR
from blueprint._config_values import setter_names
from blueprint.task import ConfigError, DeepLearningTask
from blueprint.task.data import ArrayDataset, Augment, digits


@pytest.fixture(scope="module")
def sets():
    train, val = digits()
    return ArrayDataset(train.x[:64], train.y[:64]), ArrayDataset(val.x[:32], val.y[:32])


def test_a_data_setter_changes_only_what_it_names(sets):
    train, val = sets
    task = DeepLearningTask().data(train=train, val=val, batch_size=16, eval_batch_size=8,
                                   augment=Augment(crop_padding=1), normalize=None)
    smaller = task.data(batch_size=32)
    assert (smaller.train_set, smaller.val_set, smaller.batch) == (train, val, 32)
    assert (smaller.eval_batch, smaller.augmentation, smaller.normalisation) == (8, Augment(crop_padding=1), None)
    assert task.data(val=None).val_set is None and task.data(val=None).train_set is train
    assert task.data(augment=None).augmentation is None and task.data(augment=None).batch == 16


def test_val_fraction_holds_out_part_of_the_training_set(sets):
    train, _ = sets
    task = DeepLearningTask().data(train=train, val_fraction=0.25)
    assert len(task.val_set) + len(task.train_set) == len(train) and 12 <= len(task.val_set) <= 20
    with pytest.raises(ConfigError, match="splits the training set"):
        DeepLearningTask().data(train=train, val=train, val_fraction=0.25)


def _public_setters():
    task = [(DeepLearningTask, name) for name, member in vars(DeepLearningTask).items()
            if callable(member) and not name.startswith("_") and name not in ("fit", "evaluate", "validate")]
    configs = [(cls, name) for cls in SCHEDULES + (SGD, Adam, AdamW, CrossEntropyLoss) for name in setter_names(cls)]
    return task + configs


@pytest.mark.parametrize("cls, name", _public_setters(), ids=lambda v: getattr(v, "__name__", v))
def test_every_public_setter_has_a_docstring(cls, name):
    assert (getattr(cls, name).__doc__ or "").strip(), f"{cls.__name__}.{name} has no docstring"


def _task(sets, optimizer, schedule):
    train, val = sets
    return (DeepLearningTask().model(BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(10)))).optimizer(optimizer)
            .scheduler(schedule).data(train=train, val=val, batch_size=32))


def test_the_schedule_base_lr_wins_and_two_learning_rates_warn(sets):
    with pytest.warns(UserWarning, match="the schedule's base_lr 0.02 overrides the optimizer's lr 0.5"):
        task = _task(sets, SGD(lr=0.5), StepLR(step_size=1, base_lr=0.02)).validate()
    assert task.base_lr == 0.02
    assert task.scheduler_config.lr_at(0, 0, 2, task.base_lr, 1) == 0.02
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for optimizer in (SGD(), SGD(lr=0.02)):   # the optimizer's lr left at its default, or the same value
            _task(sets, optimizer, StepLR(step_size=1, base_lr=0.02)).validate()
        assert _task(sets, SGD(lr=0.5), StepLR(step_size=1)).validate().base_lr == 0.5
