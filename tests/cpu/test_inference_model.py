"""`blueprint.Model`: inference from a checkpoint file alone, torchvision-keyed weights, raw input
normalised as in training, and the refusals of data in another layout, dtype or range."""

import numpy as np
import pytest

from blueprint import BluePrint, InputSpec, Model, cbr, fc, gap, seq, zoo
from blueprint.optim import SGD
from blueprint.task import ConfigError, DeepLearningTask
from blueprint.task import load_checkpoint, save_checkpoint
from blueprint.task.data import ArrayDataset, DataLoader, digits

FLOAT32_LOGIT_RTOL = 1e-5   # eval logits at different batch sizes: only the GEMM's summation order differs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    train, val = digits()
    val = ArrayDataset(val.x[:100], val.y[:100])
    task = (DeepLearningTask().model(BluePrint(seq(cbr(8, 3, 1, 1), gap(), fc(10)))).optimizer(SGD().lr(0.1).momentum(0.9))
            .data(train=ArrayDataset(train.x[:300], train.y[:300]), val=val,
                  batch_size=64).epochs(1).seed(0).progress(False))
    task.fit()
    path = task.save(tmp_path_factory.mktemp("model") / "digits.safetensors")
    return task, path, val


def close(a, b):
    return np.allclose(a, b, rtol=FLOAT32_LOGIT_RTOL, atol=FLOAT32_LOGIT_RTOL * np.abs(b).max())


def test_a_loaded_checkpoint_predicts_what_the_task_predicts_from_raw_uint8_images(trained):
    task, path, val = trained
    _, _, (mean, std) = task._loaders()
    normalised = np.concatenate([x for x, _ in DataLoader(val, 64, shuffle=False, mean=mean, std=std).epoch(0)])
    expected = task._forward_padded(task.session(), normalised)   # the loader's normalisation, the task's executor
    assert close(task.logits(val.x), expected)
    assert np.array_equal(task.predict(val.x), task.logits(val.x).argmax(axis=1))
    model = Model.load(path)                       # the file only: blueprint, weights and normalisation
    logits = model.logits(val.x, batch_size=32)   # uint8 as in the dataset, last batch partial (4)
    assert logits.shape == (100, 10) and close(logits, expected)
    assert np.array_equal(model.predict(val.x, batch_size=100), logits.argmax(axis=1))
    assert np.allclose(model.probabilities(val.x[:5]).sum(axis=1), 1.0, atol=1e-6)
    assert close(task.model().logits(val.x), expected)
    assert model.spec == task.model().spec and model.spec.dtype == "uint8" and model.spec.mean == tuple(mean)


def test_the_checkpoint_stores_the_input_record(trained):
    _, path, _ = trained
    _, state = load_checkpoint(path)
    assert state["input"]["layout"] == "NHWC" and state["input"]["dtype"] == "uint8"
    assert state["input"]["sample_shape"] == [8, 8, 1] and len(state["input"]["std"]) == 1


def test_a_checkpoint_without_the_input_record_is_refused_with_the_fix(trained, tmp_path):
    _, path, _ = trained
    tensors, state = load_checkpoint(path)
    del state["input"]
    save_checkpoint(tmp_path / "old.safetensors", tensors, state)
    with pytest.raises(ConfigError, match=r"stores no input normalisation.*resume\(path\)\.save\(path\)"):
        Model.load(tmp_path / "old.safetensors")
    DeepLearningTask.load(tmp_path / "old.safetensors")    # the task side still reads it


def test_a_task_trained_on_float_data_stores_its_range_and_refuses_other_units(tmp_path):
    train, _ = digits()
    floats = ArrayDataset(train.x[:200].astype(np.float32) / 255, train.y[:200])
    task = (DeepLearningTask().model(BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(10)))).data(train=floats, batch_size=100,
            normalize=None).epochs(1).progress(False))
    task.fit()
    model = Model.load(task.save(tmp_path / "floats.safetensors"))
    assert model.spec.dtype == "float32" and model.spec.mean is None
    assert (model.spec.low, model.spec.high) == ((float(floats.x.min()),), (float(floats.x.max()),))
    assert close(model.logits(floats.x), task.logits(floats.x))
    with pytest.raises(ValueError, match="training set's units"):
        model.logits(floats.x * 255)
    halved = task.data(train=ArrayDataset(floats.x / 2, floats.y), batch_size=100, normalize=None)  # same session
    assert halved.session() is task.session()
    assert Model.load(halved.save(tmp_path / "halved.safetensors")).spec.high == (float(floats.x.max() / 2),)


def test_task_model_before_training_says_to_fit_first():
    with pytest.raises(ConfigError, match=r"call fit\(\)"):
        DeepLearningTask().model(zoo.small_cnn()).model()


FLOAT_SPEC = InputSpec((4, 4, 3), "float32", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                       low=(0.0, 0.0, 0.0), high=(1.0, 1.0, 1.0))
UINT8_SPEC = InputSpec((4, 4, 3), "uint8", mean=0.5, std=0.25)
GOOD = np.random.default_rng(0).random((2, 4, 4, 3)).astype(np.float32)
GRAY_SPEC = InputSpec((4, 4, 1), "uint8", mean=0.5, std=0.25)
GRAY = (GOOD[..., :1] * 255).astype(np.uint8)
REFUSALS = [   # (spec, input, error, message, the input the message says to pass)
    ("NCHW", UINT8_SPEC, (GOOD * 255).astype(np.uint8).transpose(0, 3, 1, 2), ValueError,
     r"which is NCHW.*x\.transpose\(0, 2, 3, 1\)", lambda x: x.transpose(0, 2, 3, 1)),
    ("floats for uint8", UINT8_SPEC, GOOD, TypeError, "trained on uint8 images", lambda x: (x * 255).astype(np.uint8)),
    ("0..255 for 0..1", FLOAT_SPEC, GOOD * 255, ValueError, "training set's units", lambda x: x / 255),
    ("normalised for raw", FLOAT_SPEC, (GOOD - 0.5) / 0.05, ValueError, "not rescaled or normalised",
     lambda x: x * np.float32(0.05) + np.float32(0.5)),
    ("float64", FLOAT_SPEC, GOOD.astype(np.float64), TypeError, r"x\.astype\(np\.float32\)",
     lambda x: x.astype(np.float32)),
    ("one sample", FLOAT_SPEC, GOOD[0], ValueError, r"Pass x\[None\]", lambda x: x[None]),
    ("grayscale without C", GRAY_SPEC, GRAY[..., 0], ValueError, r"without the channel axis.*Pass x\[\.\.\., None\]$",
     lambda x: x[..., None]),
    ("one grayscale sample without C", GRAY_SPEC, GRAY[0, ..., 0], ValueError, r"Pass x\[None, \.\.\., None\]$",
     lambda x: x[None, ..., None]),
]


@pytest.mark.parametrize("spec, x, error, message, fix", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_input_the_network_would_get_wrong_is_refused_and_the_suggested_fix_runs(spec, x, error, message, fix):
    model = Model(BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(5))), spec)
    with pytest.raises(error, match=message):
        model.logits(x)
    assert model.logits(fix(x)).shape == (len(fix(x)), 5)


def test_normalisation_is_the_data_loaders():
    x = (GOOD * 255).astype(np.uint8)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.3, 0.4)
    expected = next(DataLoader(ArrayDataset(x, np.zeros(2, np.int64)), 2, shuffle=False, mean=mean, std=std).epoch(0))[0]
    assert np.array_equal(InputSpec((4, 4, 3), "uint8", mean, std).normalise(x, "test"), expected)


def test_a_bad_state_dict_loads_nothing():
    model = Model(BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(5))), (4, 4, 3))
    before = model.state_dict()
    broken = {**before, "2.weight": np.zeros((5, 3), np.float32)}
    with pytest.raises(ValueError, match=r"mis-shaped keys 2\.weight"):
        model.load_state_dict(broken)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())


def torch_resnet18():
    """torchvision's own resnet18 (tests/support/torchvision_ref.py imports it even where its C++
    operators fail to register against this torch build)."""
    from tests.support import torchvision_ref
    return torchvision_ref.torchvision_or_skip().models.resnet18(), "torchvision"


def test_torchvision_resnet18_weights_load_into_the_zoo_model_and_logits_match():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: the resnet18 oracle needs it")
    reference, _ = torch_resnet18()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():    # non-trivial BN statistics, so a mis-mapped key cannot go unnoticed
        for module in reference.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
    reference.eval()
    model = Model(zoo.resnet18(), (32, 32, 3)).load_state_dict(reference.state_dict())
    x = np.random.default_rng(1).standard_normal((2, 32, 32, 3)).astype(np.float32)
    with torch.no_grad():
        expected = reference(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    assert np.allclose(model.logits(x), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_task_and_model_share_one_predict_contract(trained):
    """task.predict takes what Model.predict takes (raw uint8 images as in the dataset) and returns the
    same: class indices; logits and probabilities by name."""
    task, path, val = trained
    model = Model.load(path)
    logits = task.logits(val.x)
    assert logits.dtype == np.float32 and close(logits, model.logits(val.x))
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3          # classes compared where the float32 ranking is not a near tie
    predicted = task.predict(val.x)
    assert predicted.dtype == np.int64 and predicted.shape == (len(val),)
    assert np.array_equal(predicted[clear], model.predict(val.x)[clear]) and clear.sum() > 90
    assert close(task.probabilities(val.x), model.probabilities(val.x))
    with pytest.raises(TypeError, match="trained on uint8 images"):
        task.predict(val.x.astype(np.float32))
    with pytest.raises(ValueError, match="NCHW"):
        task.predict(val.x.transpose(0, 3, 1, 2))
