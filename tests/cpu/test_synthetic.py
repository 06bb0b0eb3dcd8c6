"""`synthetic`: one distribution per seed, one sample per draw, so train and val are one task."""
import numpy as np

from blueprint import BluePrint, cbr, fc, gap, seq
from blueprint.optim import SGD
from blueprint.task import DeepLearningTask
from blueprint.task.data import synthetic

SHAPE, CLASSES = (8, 8, 3), 4


def _class_means(ds):
    flat = ds.x.reshape(len(ds), -1).astype(np.float64)
    return np.stack([flat[ds.y == k].mean(axis=0) for k in range(CLASSES)])


def test_draws_share_the_class_prototypes_and_differ_in_the_samples():
    train, val = synthetic(400, SHAPE, CLASSES, seed=5, draw=0), synthetic(400, SHAPE, CLASSES, seed=5, draw=1)
    assert not np.array_equal(train.x, val.x)
    same = np.linalg.norm(_class_means(train) - _class_means(val), axis=1)        # one class, two draws
    means = _class_means(train)
    between = min(np.linalg.norm(means[i] - means[j]) for i in range(CLASSES) for j in range(i))
    assert same.max() < 0.25 * between, (same, between)
    other = synthetic(400, SHAPE, CLASSES, seed=6)                                 # another seed: another task
    assert np.linalg.norm(_class_means(other) - means, axis=1).min() > same.max()


def test_a_model_trained_on_one_draw_does_as_well_on_another():
    train, val = synthetic(512, SHAPE, CLASSES, seed=0, draw=0), synthetic(256, SHAPE, CLASSES, seed=0, draw=1)
    task = (DeepLearningTask().model(BluePrint(seq(cbr(8, 3, 1, 1), gap(), fc(CLASSES))))
            .optimizer(SGD().lr(0.05).momentum(0.9)).data(train=train, val=val, batch_size=64)
            .epochs(3).seed(0).progress(False))
    last = task.fit()[-1]
    assert last.train_accuracy > 0.6                                   # chance is 0.25
    assert last.val_accuracy >= last.train_accuracy - 0.1, (last.train_accuracy, last.val_accuracy)


def test_the_cli_synthetic_data_is_one_distribution():
    from blueprint._train_command import load_data

    train, val, name = load_data("synthetic")
    assert name == "synthetic" and train.sample_shape == val.sample_shape and len(train) > len(val)
    means_train, means_val = (np.stack([ds.x[ds.y == k].reshape(-1, ds.x[0].size).mean(axis=0) for k in range(10)])
                              for ds in (train, val))
    same = np.linalg.norm(means_train - means_val, axis=1).max()
    between = min(np.linalg.norm(means_train[i] - means_train[j]) for i in range(10) for j in range(i))
    assert same < 0.25 * between, (same, between)
