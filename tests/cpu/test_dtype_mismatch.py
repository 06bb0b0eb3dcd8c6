"""Issue 24 item 8: a validation (or `evaluate()`) set of float copies of uint8 training images would be
divided by 1 instead of 255 (val loss 976.7 against 0.393); the task refuses it, as `Model.logits` does."""
import numpy as np
import pytest

from blueprint import BluePrint, conv, fc, gap, relu, seq
from blueprint import ConfigError
from blueprint.optim import SGD
from blueprint.task import DeepLearningTask
from blueprint.task.data import ArrayDataset

IMAGES = np.random.default_rng(0).integers(0, 256, (8, 4, 4, 1), dtype=np.uint8)
LABELS = np.arange(8) % 2
NET = BluePrint(seq(conv(4, 3, 1, 1), relu(), gap(), fc(2)))


def _task(val=None):
    return (DeepLearningTask().model(NET).optimizer(SGD().lr(0.01))
            .data(train=ArrayDataset(IMAGES, LABELS), val=val, batch_size=8).epochs(1).progress(False))


def test_float_copies_of_uint8_images_are_refused_as_validation_data():
    with pytest.raises(ConfigError, match=r"data\(val=...\): the training data is uint8 but this set is float32"):
        _task(ArrayDataset(IMAGES.astype(np.float32), LABELS)).fit()


def test_float_copies_of_uint8_images_are_refused_by_evaluate():
    task = _task()
    with pytest.raises(ConfigError, match=r"evaluate\(dataset\): the training data is uint8 but this set is float32"):
        task.evaluate(ArrayDataset(IMAGES.astype(np.float32), LABELS))
    assert np.isfinite(task.evaluate(ArrayDataset(IMAGES, LABELS))["loss"])   # the uint8 set itself is fine
