"""CpuExecutor: the arena and separate-buffer modes agree bit for bit (which checks the memory
plan on any machine), bad input is refused before anything changes, and state dicts move
weights in and out in PyTorch layouts."""
import re

import numpy as np
import pytest

from blueprint import BluePrint, add2, bn, conv, dropout, fc, gap, identity, maxpool, relu, seq, zoo
from blueprint.optim import SGD, AdamW, CrossEntropyLoss
from cpu_ref import CpuExecutor, InputError
from planner import ArchPlan
from planner.compiler import Compiler

# every zoo model small enough for a CI step: (name, input H, W, C, batch). The ImageNet-sized
# models run at 32x32 (their structure is resolution-agnostic; only the classifier input changes).
ZOO_SMALL = [("small_cnn", (8, 8, 1), 4), ("mlp", (1, 1, 784), 4), ("resnet20", (16, 16, 3), 2),
             ("resnet32", (16, 16, 3), 2), ("resnet18", (32, 32, 3), 2), ("resnet50", (32, 32, 3), 2),
             ("mobilenet_v2", (32, 32, 3), 2), ("vgg11_bn", (32, 32, 3), 2),
             ("mobilenet_v3_small", (32, 32, 3), 2), ("efficientnet_b0", (32, 32, 3), 2)]   # SE, drop_path


def _compile(bp, hwc, batch, slots=1):
    h, w, c = hwc
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=c)).compile(
        {"train": (batch, h, w, c), "train_last": (1, h, w, c), "eval": (batch, h, w, c)}, optimizer_state_slots=slots)
    plan.verify()
    return plan


def _batches(hwc, batch, classes, count, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch,) + hwc).astype(np.float32), rng.integers(0, classes, batch)) for _ in range(count)]


@pytest.mark.parametrize("name, hwc, batch", ZOO_SMALL, ids=[m[0] for m in ZOO_SMALL])
def test_arena_and_separate_buffers_are_bit_identical(name, hwc, batch):
    entry = zoo.MODELS[name]
    bp = entry.build() if name != "mlp" else zoo.mlp([784, 64, 32, 10])
    classes = entry.num_classes
    plan = _compile(bp, hwc, batch, slots=2)
    runs = []
    for separate in (False, True):
        ex = CpuExecutor(plan, CrossEntropyLoss().label_smoothing(0.1), AdamW().lr(1e-3), seed=5, separate_buffers=separate)
        losses = [ex.train_step(x, y, 1e-3) for x, y in _batches(hwc, batch, classes, 2)]
        x_last, y_last = _batches(hwc, 1, classes, 1, seed=9)[0]
        losses.append(ex.train_step(x_last, y_last, 1e-3))  # the partial-batch variant shares the offsets
        logits = ex.forward(_batches(hwc, batch, classes, 1, seed=3)[0][0])
        runs.append((losses, logits, ex.state_dict(), ex.gradients()))
    (loss_a, logits_a, state_a, grads_a), (loss_b, logits_b, state_b, grads_b) = runs
    assert loss_a == loss_b
    assert np.array_equal(logits_a, logits_b)
    assert all(np.array_equal(state_a[k], state_b[k]) for k in state_a)
    assert all(np.array_equal(grads_a[k], grads_b[k]) for k in grads_a)
    assert np.isfinite(loss_a).all()


def test_dropout_masks_are_deterministic_and_change_per_step():
    bp = BluePrint(seq(conv(8, 3, 1, 1), bn(), relu(), gap(), dropout(0.5), fc(4)))
    plan = _compile(bp, (6, 6, 3), 8)
    (x, y), = _batches((6, 6, 3), 8, 4, 1)
    a, b = CpuExecutor(plan, seed=1), CpuExecutor(plan, seed=1)
    first = [a.train_step(x, y, 0.0) for _ in range(2)]
    second = [b.train_step(x, y, 0.0) for _ in range(2)]
    assert first == second                 # same seed, same steps: same masks
    assert first[0] != first[1]            # lr 0, same batch: only the mask changed between steps
    assert CpuExecutor(plan, seed=2).train_step(x, y, 0.0) != first[0]


BAD_BATCHES = [
    ("wrong dtype", lambda x, y: (x.astype(np.float64), y), "float32"),
    ("wrong rank", lambda x, y: (x[0], y), "NHWC"),
    ("wrong shape", lambda x, y: (x[:, :4], y), "no compiled train variant"),
    ("NaN", lambda x, y: (np.where(x > 1, np.nan, x).astype(np.float32), y), "NaN or Inf"),
    ("Inf", lambda x, y: (np.where(x > 1, np.inf, x).astype(np.float32), y), "NaN or Inf"),
    ("label too large", lambda x, y: (x, y + 10), "labels must be in [0, 10)"),
    ("negative label", lambda x, y: (x, y - 10), "labels must be in [0, 10)"),
    ("float labels", lambda x, y: (x, y.astype(np.float32)), "integer labels"),
    ("label count", lambda x, y: (x, y[:-1]), "integer labels of shape"),
]


@pytest.mark.parametrize("what, corrupt, fragment", BAD_BATCHES, ids=[b[0] for b in BAD_BATCHES])
def test_bad_input_is_refused_and_parameters_untouched(what, corrupt, fragment):
    plan = _compile(zoo.small_cnn(), (8, 8, 1), 4)
    ex = CpuExecutor(plan, optimizer=SGD().momentum(0.9))
    (x, y), = _batches((8, 8, 1), 4, 10, 1)
    before = ex.state_dict()
    with pytest.raises(InputError, match=re.escape(fragment)):
        ex.train_step(*corrupt(x, y), 0.1)
    after = ex.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert ex.step_count == 0


def test_state_dict_round_trip_and_load_errors():
    plan = _compile(zoo.resnet20(), (8, 8, 3), 2)
    a, b = CpuExecutor(plan, seed=0), CpuExecutor(plan, seed=1)
    state = a.state_dict()
    assert state["conv1.weight"].shape == (16, 3, 3, 3)          # PyTorch's OIHW
    assert state["layer1.0.bn1.num_batches_tracked"].dtype == np.int64
    b.load_state_dict(state)
    x = _batches((8, 8, 3), 2, 10, 1)[0][0]
    assert np.array_equal(a.forward(x), b.forward(x))
    broken = dict(state)
    del broken["fc.bias"]
    broken["extra.weight"] = np.zeros(3)
    broken["conv1.weight"] = np.zeros((16, 3, 5, 5))
    with pytest.raises(KeyError) as error:
        b.load_state_dict(broken)
    message = str(error.value)
    assert "missing keys ['fc.bias']" in message and "extra.weight" in message
    assert "conv1.weight: expected (16, 3, 3, 3), got (16, 3, 5, 5)" in message


def test_fc_after_flatten_uses_pytorch_feature_order():
    """An fc on a flattened NHWC map exposes its weight with features in PyTorch's (C, H, W) order."""
    torch = pytest.importorskip("torch", reason="PyTorch not installed: this check compares with torch.flatten")
    bp = BluePrint(seq(conv(4, 3, 1, 1), bn(), relu(), maxpool(2, 2), fc(5)))
    plan = _compile(bp, (6, 6, 2), 3)
    ex = CpuExecutor(plan, seed=0)
    state = ex.state_dict()
    assert state["4.weight"].shape == (5, 4 * 3 * 3)
    x = _batches((6, 6, 2), 3, 5, 1)[0][0]
    ours = ex.forward(x)
    t = {k: torch.tensor(v) for k, v in state.items()}
    h = torch.nn.functional.conv2d(torch.tensor(x).permute(0, 3, 1, 2), t["0.weight"], padding=1)
    h = torch.nn.functional.batch_norm(h, t["1.running_mean"], t["1.running_var"], t["1.weight"], t["1.bias"], False)
    h = torch.nn.functional.max_pool2d(torch.relu(h), 2)
    expected = torch.nn.functional.linear(torch.flatten(h, 1), t["4.weight"], t["4.bias"]).numpy()
    assert np.allclose(ours, expected, atol=1e-5)


def test_cpu_executor_refuses_fused_plans():
    arch = ArchPlan.from_blueprint(zoo.small_cnn(), in_channels=1, fuse=True, amp=True)
    plan = Compiler(arch).compile({"train": (2, 8, 8, 1)})
    with pytest.raises(ValueError, match="fp32 unfused"):
        CpuExecutor(plan)


@pytest.mark.parametrize("root, copies", [(seq(fc(4), add2(identity(), identity()), fc(3)), 2),
                                          (seq(fc(4), add2(identity(), add2(identity(), identity())), fc(3)), 3)],
                         ids=["x+x", "x+(x+x)"])
def test_add2_of_one_value_twice_sums_both_gradients(root, copies):
    """logits = fc2(copies * fc1(u)): every parameter gradient matches the analytic one in float64, which
    fails if the backward of add(x, x) gives x only one copy of dy (or reads a gradient nobody wrote)."""
    batch = 5
    plan = _compile(BluePrint(root), (1, 1, 3), batch)
    ex = CpuExecutor(plan, seed=0)
    (x, y), = _batches((1, 1, 3), batch, 3, 1)
    ex.train_step(x, y, 0.0)
    state = {name: value.astype(np.float64) for name, value in ex.state_dict().items()}
    u = x.reshape(batch, 3).astype(np.float64)
    hidden = u @ state["0.weight"].T + state["0.bias"]
    logits = copies * hidden @ state["2.weight"].T + state["2.bias"]
    dlogits = np.exp(logits - logits.max(1, keepdims=True))
    dlogits /= dlogits.sum(1, keepdims=True)
    dlogits[np.arange(batch), y] -= 1
    dlogits /= batch                                   # mean over the batch
    dhidden = copies * dlogits @ state["2.weight"]
    expected = {"0.weight": dhidden.T @ u, "0.bias": dhidden.sum(0),
                "2.weight": dlogits.T @ (copies * hidden), "2.bias": dlogits.sum(0)}
    grads = ex.gradients()
    for name, value in expected.items():
        assert np.allclose(grads[name], value, rtol=1e-4, atol=1e-6), name


def test_convolutions_run_the_algorithms_their_plan_recorded(monkeypatch):
    """The executor hands each convolution the plan's ``conv`` record: with the kernels' own rule removed a
    training step and a forward still run (an executor that stopped passing the record would call it)."""
    from cpu_ref import _conv
    bp = BluePrint(seq(conv(16, 3, 1, 1), bn(), relu(), conv(16, 3, 2, 1), bn(), relu(), gap(), fc(10)))
    plan = _compile(bp, (8, 8, 3), 4)
    monkeypatch.setattr(_conv, "conv_algorithms", None)
    ex = CpuExecutor(plan, CrossEntropyLoss(), SGD().lr(0.1), seed=1)
    x, y = _batches((8, 8, 3), 4, 10, 1)[0]
    assert np.isfinite(ex.train_step(x, y, 0.1))
    assert np.isfinite(ex.forward(x)).all()
