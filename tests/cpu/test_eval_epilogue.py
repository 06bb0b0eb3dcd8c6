"""The eval forward's convolution epilogue (`cpu_ref._epilogue`): BatchNorm with its running statistics, then
optionally the residual add and ReLU, applied by the convolution to each block of its output, gives the same
bits as the kernels run one by one, for each forward algorithm that takes one (pointwise, direct, Winograd,
im2col + GEMM),
each way the result reaches its tensor (scratch rows, in place, into a separate array), serially and on the
thread pool; and the executor's chains (``eval_epilogues``) leave every zoo model's eval logits, loss and count
unchanged, in the arena (where some chains' outputs overlap what the convolution still reads) and with separate
buffers."""
import collections

import numpy as np
import pytest

from blueprint import zoo
from blueprint.optim import CrossEntropyLoss
from cpu_ref import CpuExecutor
from cpu_ref import _conv as C
from cpu_ref import kernels as K
from planner import ArchPlan
from planner.compiler import Compiler
from planner.conv_algorithm import ConvAlgorithms
from planner.ops import Prim

F32 = np.float32

# algorithm, x (N, H, W, Cin), w (Cout, KH, KW, Cin), stride, padding
CASES = [("pointwise", (2, 5, 6, 16), (24, 1, 1, 16), 1, 0),
         ("pointwise", (4, 40, 40, 8), (64, 1, 1, 8), 1, 0),   # 6400 rows: several chunks per partition
         ("direct", (2, 7, 9, 3), (16, 3, 3, 3), 1, 1),
         ("gemm", (2, 6, 7, 16), (40, 3, 3, 16), 2, 1),
         ("winograd", (3, 9, 8, 16), (24, 3, 3, 16), 1, 1)]   # in chunks of one band (the last one row high)


def _case(algorithm, xs, ws, s, p, seed=0):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(xs).astype(F32), rng.standard_normal(ws).astype(F32)
    oh, ow = (xs[1] + 2 * p - ws[1]) // s + 1, (xs[2] + 2 * p - ws[2]) // s + 1
    cout = ws[0]
    bn = (rng.uniform(0.5, 2, cout).astype(F32), rng.standard_normal(cout).astype(F32),
          rng.standard_normal(cout).astype(F32), rng.uniform(0.1, 3, cout).astype(F32))
    residual = rng.standard_normal((xs[0], oh, ow, cout)).astype(F32)
    kh, kw = ws[1], ws[2]
    col = np.zeros((xs[0] * oh * ow, kh * kw * ws[3]), F32)
    return x, w, bn, residual, col, (xs[0], oh, ow, cout), ConvAlgorithms(algorithm, algorithm, algorithm)


def _one_by_one(x, w, bn, residual, col, y_shape, algorithms, s, p, add, relu):
    y = np.empty(y_shape, F32)
    K.conv2d_forward(x, w, y, s, p, 1, col, algorithms)
    z = np.empty_like(y)
    K.batchnorm_forward_eval(y.reshape(-1, y.shape[3]), *bn, 1e-5, z.reshape(-1, y.shape[3]))
    if add:
        K.add_forward(z, residual, z)
    if relu:
        K.activation_forward(Prim.RELU, z.reshape(-1), z.reshape(-1))
    return z


@pytest.mark.parametrize("algorithm, xs, ws, s, p", CASES, ids=[f"{c[0]}-{c[1][0] * c[1][1] * c[1][2]}" for c in CASES])
@pytest.mark.parametrize("add, relu", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["bn", "bn-relu", "bn-add", "bn-add-relu"])
@pytest.mark.parametrize("into", ["scratch", "in place", "separate"])
def test_the_epilogue_gives_the_bits_of_the_kernels_one_by_one(pool, algorithm, xs, ws, s, p, add, relu, into,
                                                                monkeypatch):
    if algorithm == "winograd":   # several chunks per partition: the scratch rows are reused
        monkeypatch.setattr(C, "chunk_bands", lambda *shape: 1)
    x, w, bn, residual, col, y_shape, algorithms = _case(algorithm, xs, ws, s, p)
    want = _one_by_one(x, w, bn, residual, col, y_shape, algorithms, s, p, add, relu)
    y = np.full(y_shape, np.nan, F32)
    out = y if into == "in place" else np.full(y_shape, np.nan, F32)
    cout = y_shape[3]
    epilogue = K.Epilogue(*K.eval_scale_shift(*bn, 1e-5), residual.reshape(-1, cout) if add else np.zeros((0, 0), F32),
                          relu, out.reshape(-1, cout), into == "scratch")
    K.conv2d_forward(x, w, y, s, p, 1, col, algorithms, epilogue)
    assert np.array_equal(out, want), f"{algorithm}: largest difference {np.nanmax(np.abs(out - want))}"


def test_an_epilogue_is_refused_where_the_algorithm_has_none():
    x, w = np.ones((1, 4, 4, 8), F32), np.ones((8, 3, 3, 1), F32)
    with pytest.raises(ValueError, match="groups 1 and the pointwise, direct, winograd or gemm algorithm; got groups 8"):
        K.conv2d_forward(x, w, np.empty((1, 4, 4, 8), F32), 1, 1, 8, np.zeros((0, 0), F32), None,
                         K.Epilogue(np.ones(8, F32), np.zeros(8, F32), np.zeros((0, 0), F32), False,
                                    np.empty((16, 8), F32), False))


# every zoo model with a convolution followed by BatchNorm, small: (name, input H, W, C, batch)
# (VGG at batch 3: its 128-channel 16x16 layers have enough tiles for Winograd, `planner.conv_algorithm.winograd_pays`)
ZOO = [("resnet20", (16, 16, 3), 2), ("resnet18", (32, 32, 3), 2), ("resnet50", (32, 32, 3), 2),
       ("mobilenet_v2", (32, 32, 3), 2), ("vgg11_bn", (32, 32, 3), 3), ("mobilenet_v3_small", (32, 32, 3), 2),
       ("efficientnet_b0", (32, 32, 3), 2)]


def _zoo_plan(name, shape):
    return Compiler(ArchPlan.from_blueprint(zoo.MODELS[name].build(), in_channels=shape[3])).compile(
        {"train": shape, "eval": shape}, optimizer_state_slots=1)


def _chains(ex, shape):
    """The chains the executor runs in the eval graph at ``shape`` (found without running anything)."""
    return [c for _, c in _chain_ops(ex, shape)]


def _chain_ops(ex, shape):
    """``(op index, chain)`` of each chain the executor runs in the eval graph at ``shape``."""
    variant = ex._variant_for(shape, "eval")
    return [(i, c) for i, c in ex._op_chains(variant, "eval", ex._variant_views(variant)).items() if c is not None]


@pytest.mark.parametrize("name, hwc, batch", ZOO, ids=[m[0] for m in ZOO])
@pytest.mark.parametrize("separate", [False, True], ids=["arena", "separate buffers"])
def test_the_chains_leave_every_zoo_models_eval_results_unchanged(name, hwc, batch, separate):
    entry = zoo.MODELS[name]
    shape = (batch, *hwc)
    plan = _zoo_plan(name, shape)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(shape).astype(F32), rng.integers(0, entry.num_classes, batch)
    results = []
    for epilogues in (True, False):
        ex = CpuExecutor(plan, CrossEntropyLoss(), seed=3, separate_buffers=separate, eval_epilogues=epilogues)
        ex.train_step(x, y, 0.0)       # running statistics away from (0, 1); the weights as initialised
        results.append((ex.forward(x), *ex.evaluate_batch(x, y)))
        if epilogues:
            assert _chains(ex, shape), f"{name}: no convolution ran an epilogue"
    (logits, loss, correct, eval_logits), (want_logits, want_loss, want_correct, want_eval_logits) = results
    assert np.isfinite(want_logits).all()
    assert np.array_equal(logits, want_logits) and np.array_equal(eval_logits, want_eval_logits)
    assert (loss, correct) == (want_loss, want_correct)


def test_the_zoo_exercises_every_way_to_the_output():
    """In the arena, the models of the test above have chains of each way to the output, and chains after each
    forward algorithm that takes one, so that test checks each. (Found here on its own: under pytest-xdist the test
    above may run in another process.)"""
    modes, algorithms = collections.Counter(), collections.Counter()
    for name, hwc, batch in ZOO:
        shape = (batch, *hwc)
        plan = _zoo_plan(name, shape)
        ops = {op.index: op for op in plan.graphs["eval"].ops}
        for index, chain in _chain_ops(CpuExecutor(plan), shape):
            modes[chain.mode] += 1
            algorithms[ops[index].attr("conv").forward] += 1
    assert set(modes) == {"scratch", "in place", "copy"}, modes
    assert set(algorithms) == {"pointwise", "direct", "winograd", "gemm"}, algorithms
