"""CPU kernels against the numpy reference, and the reference against finite differences.

One table (``PRIMITIVES``) of every primitive of docs/kernel-contract.md drives:
- the numba kernel's forward outputs vs the reference (fp32 vs float64),
- its backward with ``accumulate=False`` (outputs pre-filled with NaN: every element must
  be written), ``accumulate=True`` (input gradients added onto random values; parameter
  gradients still overwritten) and ``dx=None`` (parameter gradients still right),
- the reference's gradients vs float64 central differences of the reference forward,
each of the kernel checks both in the calling thread and on the thread pool, whose
results must also be the same bits (the size threshold never changes how work is split).
"""
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from cpu_ref import _misc
from cpu_ref import kernels as K
from planner import ops
from planner import reference as R
from tests.support.kind_params import ACTIVATION_EXAMPLES

F32 = np.float32


@dataclass(frozen=True)
class Prim:
    """One primitive: inputs, reference and kernel forward/backward adapters, tolerance.

    ``ref_forward(t) -> tuple`` and ``kernel_forward(t) -> tuple`` return the same outputs
    (the first is the differentiated one); ``ref_backward(t, dy) -> {name: grad}``;
    ``kernel_backward(t, dy, grads, accumulate)`` writes into ``grads`` (an input gradient
    may be ``None``). ``input_grads`` take ``accumulate``; ``param_grads`` are overwritten.
    """
    id: str
    shapes: dict
    ref_forward: Callable
    kernel_forward: Callable
    ref_backward: Callable = None
    kernel_backward: Callable = None
    input_grads: tuple = ()
    param_grads: tuple = ()
    makers: dict = field(default_factory=dict)
    tol: float = 1e-4
    finite_differences: bool = True   # off for rows too big to differentiate element by element

    def inputs(self, seed=0):
        rng = np.random.default_rng(seed)
        return {name: self.makers.get(name, _normal)(rng, shape) for name, shape in self.shapes.items()}


def _normal(rng, shape):
    return rng.standard_normal(shape)


def _positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def _spread(rng, shape):
    return 4.0 * rng.standard_normal(shape)


def _f32(t):
    return {k: (v.astype(F32) if v.dtype.kind == "f" else v) for k, v in t.items()}


# ---------------------------------------------------------------------------- table rows

def conv(n, h, w, cin, cout, k, s, p, g, finite_differences=True):
    def col_for(t):
        if (k == 1 and s == 1 and p == 0 and g == 1) or (g == cin == cout):
            return None
        oh, ow = R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p)
        return np.full(n * oh * ow * k * k * (cin // g), np.nan, F32)

    def kf(t):
        y = np.full((n, R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p), cout), np.nan, F32)
        K.conv2d_forward(t["x"], t["w"], y, s, p, g, col_for(t))
        return (y,)

    def kb(t, dy, grads, acc):
        K.conv2d_backward(t["x"], t["w"], dy, grads["x"], grads["w"], s, p, g, col_for(t), acc)

    def rb(t, dy):
        dx, dw = R.conv2d_backward(t["x"], t["w"], dy, s, p, g)
        return {"x": dx, "w": dw}

    return Prim(f"conv{k}x{k}_s{s}p{p}g{g}_{n}x{h}x{w}x{cin}to{cout}", {"x": (n, h, w, cin), "w": (cout, k, k, cin // g)},
                lambda t: (R.conv2d_forward(t["x"], t["w"], s, p, g),), kf, rb, kb, ("x",), ("w",),
                finite_differences=finite_differences)


def batchnorm_train(m, c, momentum=0.1, eps=1e-5):
    def rf(t):
        return R.batchnorm_forward_train(t["x"], t["gamma"], t["beta"], t["rm"], t["rv"], momentum, eps)

    def kf(t):
        y = np.full((m, c), np.nan, F32)
        mean, invstd = np.full(c, np.nan, F32), np.full(c, np.nan, F32)
        rm, rv = t["rm"].copy(), t["rv"].copy()
        K.batchnorm_forward_train(t["x"], t["gamma"], t["beta"], y, mean, invstd, rm, rv, momentum, eps)
        return y, mean, invstd, rm, rv

    def rb(t, dy):
        _, mean, invstd, _, _ = rf(t)
        dx, dgamma, dbeta = R.batchnorm_backward(t["x"], t["gamma"], mean, invstd, dy)
        return {"x": dx, "gamma": dgamma, "beta": dbeta}

    def kb(t, dy, grads, acc):
        _, mean, invstd, _, _ = kf(t)
        K.batchnorm_backward(t["x"], t["gamma"], mean, invstd, dy, grads["x"], grads["gamma"], grads["beta"], acc)

    return Prim(f"bn_train_{m}x{c}", {"x": (m, c), "gamma": (c,), "beta": (c,), "rm": (c,), "rv": (c,)},
                rf, kf, rb, kb, ("x",), ("gamma", "beta"), {"rv": _positive})


def batchnorm_eval(m, c, eps=1e-5):
    def kf(t):
        y = np.full((m, c), np.nan, F32)
        K.batchnorm_forward_eval(t["x"], t["gamma"], t["beta"], t["rm"], t["rv"], eps, y)
        return (y,)

    return Prim(f"bn_eval_{m}x{c}", {"x": (m, c), "gamma": (c,), "beta": (c,), "rm": (c,), "rv": (c,)},
                lambda t: (R.batchnorm_forward_eval(t["x"], t["gamma"], t["beta"], t["rm"], t["rv"], eps),), kf,
                makers={"rv": _positive})


def activation(kind, n=47):
    """Any activation of the op table: its row's reference pair is the spec of the kernels, with every
    parameter at a non-default value (tests/support/kind_params.py)."""
    row, params = ops.OPS[kind], ACTIVATION_EXAMPLES[kind]
    saved = "y" if row.saves == ("output",) else "x"

    def kf(t):
        y = np.full(n, np.nan, F32)
        K.activation_forward(kind, t["x"], y, params)
        return (y,)

    def rb(t, dy):
        s = row.reference_forward(t["x"], *params) if saved == "y" else t["x"]
        return {"x": row.reference_backward(s, dy, *params)}

    def kb(t, dy, grads, acc):
        s = kf(t)[0] if saved == "y" else t["x"]
        K.activation_backward(kind, s, dy, grads["x"], params, acc)

    return Prim(f"{kind.value}_saves_{saved}", {"x": (n,)}, lambda t: (row.reference_forward(t["x"], *params),),
                kf, rb, kb, ("x",), makers={"x": _spread})


def maxpool(n, h, w, c, k, s, p):
    oh, ow = R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p)

    def kf(t):
        y, am = np.full((n, oh, ow, c), np.nan, F32), np.full((n, oh, ow, c), -1, np.int32)
        K.maxpool_forward(t["x"], y, am, k, s, p)
        return y, am

    def rb(t, dy):
        return {"x": R.maxpool_backward(R.maxpool_forward(t["x"], k, s, p)[1], dy, t["x"].shape)}

    def kb(t, dy, grads, acc):
        K.maxpool_backward(kf(t)[1], dy, grads["x"], acc)

    return Prim(f"maxpool{k}s{s}p{p}_{n}x{h}x{w}x{c}", {"x": (n, h, w, c)},
                lambda t: R.maxpool_forward(t["x"], k, s, p), kf, rb, kb, ("x",))


def avgpool(n, h, w, c, k, s, p):
    oh, ow = R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p)

    def kf(t):
        y = np.full((n, oh, ow, c), np.nan, F32)
        K.avgpool_forward(t["x"], y, k, s, p)
        return (y,)

    return Prim(f"avgpool{k}s{s}p{p}_{n}x{h}x{w}x{c}", {"x": (n, h, w, c)},
                lambda t: (R.avgpool_forward(t["x"], k, s, p),), kf,
                lambda t, dy: {"x": R.avgpool_backward(dy, t["x"].shape, k, s, p)},
                lambda t, dy, g, acc: K.avgpool_backward(dy, g["x"], k, s, p, acc), ("x",))


def gap(n, h, w, c):
    def kf(t):
        y = np.full((n, c), np.nan, F32)
        K.gap_forward(t["x"], y)
        return (y,)

    return Prim(f"gap_{n}x{h}x{w}x{c}", {"x": (n, h, w, c)}, lambda t: (R.gap_forward(t["x"]),), kf,
                lambda t, dy: {"x": R.gap_backward(dy, t["x"].shape)},
                lambda t, dy, g, acc: K.gap_backward(dy, g["x"], acc), ("x",))


def linear(n, fin, fout, bias):
    shapes = {"x": (n, fin), "w": (fout, fin)} | ({"b": (fout,)} if bias else {})

    def kf(t):
        y = np.full((n, fout), np.nan, F32)
        K.linear_forward(t["x"], t["w"], t.get("b"), y)
        return (y,)

    def rb(t, dy):
        dx, dw, db = R.linear_backward(t["x"], t["w"], dy)
        return {"x": dx, "w": dw} | ({"b": db} if bias else {})

    def kb(t, dy, g, acc):
        K.linear_backward(t["x"], t["w"], dy, g["x"], g["w"], g.get("b"), acc)

    return Prim(f"linear_{n}x{fin}to{fout}_bias{bias}", shapes,
                lambda t: (R.linear_forward(t["x"], t["w"], t.get("b")),), kf, rb, kb,
                ("x",), ("w", "b") if bias else ("w",))


def add(shape):
    def kf(t):
        y = np.full(shape, np.nan, F32)
        K.add_forward(t["a"], t["b"], y)
        return (y,)

    def kb(t, dy, g, acc):
        K.accumulate_into(g["a"], dy, acc)
        K.accumulate_into(g["b"], dy, acc)

    return Prim(f"add_{'x'.join(map(str, shape))}", {"a": shape, "b": shape},
                lambda t: (R.add_forward(t["a"], t["b"]),), kf, lambda t, dy: {"a": dy, "b": dy}, kb, ("a", "b"))


def dropout(shape, p, seed=1234, step=7):
    def kf(t):
        y, mask = np.full(shape, np.nan, F32), np.full(shape, 9, np.uint8)
        K.dropout_forward(t["x"], y, mask, p, seed, step)
        return y, mask

    def rb(t, dy):
        return {"x": R.dropout_backward(R.dropout_mask(shape, p, seed, step), dy, p)}

    def kb(t, dy, g, acc):
        K.dropout_backward(kf(t)[1], dy, g["x"], p, acc)

    return Prim(f"dropout_p{p}_{'x'.join(map(str, shape))}", {"x": shape},
                lambda t: R.dropout_forward(t["x"], p, seed, step), kf, rb, kb, ("x",))


def channel_mul(n, h, w, c):
    def kf(t):
        y = np.full((n, h, w, c), np.nan, F32)
        K.channel_mul_forward(t["x"], t["s"], y)
        return (y,)

    def rb(t, dy):
        dx, ds = R.channel_mul_backward(t["x"], t["s"], dy)
        return {"x": dx, "s": ds}

    return Prim(f"channel_mul_{n}x{h}x{w}x{c}", {"x": (n, h, w, c), "s": (n, c)},
                lambda t: (R.channel_mul_forward(t["x"], t["s"]),), kf, rb,
                lambda t, dy, g, acc: K.channel_mul_backward(t["x"], t["s"], dy, g["x"], g["s"], acc, acc), ("x", "s"))


def drop_path(shape, p, seed=1234, step=7):
    def kf(t):
        y, mask = np.full(shape, np.nan, F32), np.full(shape[:1], 9, np.uint8)
        K.drop_path_forward(t["x"], y, mask, p, seed, step)
        return y, mask

    def rb(t, dy):
        return {"x": R.drop_path_backward(R.drop_path_mask(shape[0], p, seed, step), dy, p)}

    def kb(t, dy, g, acc):
        K.drop_path_backward(kf(t)[1], dy, g["x"], p, acc)

    return Prim(f"drop_path_p{p}_{'x'.join(map(str, shape))}", {"x": shape},
                lambda t: R.drop_path_forward(t["x"], p, seed, step), kf, rb, kb, ("x",))


def channel_pad(n, h, w, c, c_out):
    def kf(t):
        y = np.full((n, h, w, c_out), np.nan, F32)
        K.channel_pad_forward(t["x"], y)
        return (y,)

    return Prim(f"channel_pad_{c}to{c_out}", {"x": (n, h, w, c)}, lambda t: (R.channel_pad_forward(t["x"], c_out),),
                kf, lambda t, dy: {"x": R.channel_pad_backward(dy, c)},
                lambda t, dy, g, acc: K.channel_pad_backward(dy, g["x"], acc), ("x",))


def cross_entropy(n, k, smoothing, label_dtype, grad_scale=1.0):
    def labels(rng, shape):
        return rng.integers(0, k, shape).astype(label_dtype)

    def kf(t):
        return (np.array(K.softmax_cross_entropy(t["logits"], t["labels"], smoothing, None, grad_scale)),)

    # the table differentiates the loss itself: undo grad_scale (test_cross_entropy_grad_scale checks it)
    def rb(t, dy):
        return {"logits": dy / grad_scale * R.softmax_cross_entropy(t["logits"], t["labels"], smoothing, grad_scale)[1]}

    def kb(t, dy, g, acc):
        K.softmax_cross_entropy(t["logits"], t["labels"], smoothing, g["logits"], grad_scale)
        g["logits"] *= dy / F32(grad_scale)

    return Prim(f"cross_entropy_{n}x{k}_ls{smoothing}_{np.dtype(label_dtype).name}_gs{grad_scale}",
                {"logits": (n, k), "labels": (n,)},
                lambda t: (np.array(R.softmax_cross_entropy(t["logits"], t["labels"], smoothing, grad_scale)[0]),),
                kf, rb, kb, (), ("logits",), {"labels": labels, "logits": _spread})


PRIMITIVES = [
    conv(2, 6, 5, 3, 4, 3, 1, 1, 1),
    conv(3, 7, 7, 4, 6, 3, 2, 1, 2),
    conv(2, 7, 6, 3, 5, 5, 2, 2, 1),
    conv(2, 5, 5, 6, 4, 1, 1, 0, 1),
    conv(2, 6, 6, 4, 6, 1, 2, 0, 1),
    conv(3, 6, 5, 4, 4, 3, 1, 1, 4),
    conv(2, 7, 7, 6, 6, 3, 2, 1, 6),
    conv(4, 16, 16, 8, 8, 3, 1, 1, 1, finite_differences=False),   # several im2col chunks per worker
    batchnorm_train(24, 5),
    batchnorm_train(6, 3),
    batchnorm_eval(12, 4),
    *[activation(kind) for kind in ops.ACTIVATIONS],   # every activation of the op table
    maxpool(2, 7, 6, 3, 3, 2, 1),
    maxpool(2, 6, 6, 2, 2, 2, 0),
    avgpool(2, 7, 6, 3, 3, 2, 1),
    avgpool(2, 6, 6, 2, 2, 2, 0),
    gap(3, 4, 5, 6),
    linear(5, 7, 4, True),
    linear(3, 6, 5, False),
    add((2, 3, 3, 4)),
    dropout((4, 5, 6), 0.3),
    dropout((40,), 0.0),
    channel_pad(2, 3, 3, 3, 5),
    channel_mul(3, 4, 5, 6),
    drop_path((8, 3, 2, 4), 0.5),
    drop_path((5, 6), 0.0),
    cross_entropy(6, 5, 0.0, np.int64),
    cross_entropy(5, 7, 0.1, np.int32, grad_scale=8.0),
]
DIFFERENTIABLE = [prim for prim in PRIMITIVES if prim.ref_backward is not None]


@pytest.fixture(params=["calling_thread", "thread_pool"])
def partitions(request, monkeypatch):
    """Run each kernel check in the calling thread and on the thread pool."""
    if request.param == "thread_pool":
        monkeypatch.setattr(_misc, "PARALLEL_MIN_ELEMENTS", 1)
    return request.param


def _assert_close(got, want, tol, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))),
                                   err_msg=what)


def _dy(prim, t, seed=1):
    y = prim.ref_forward(t)[0]
    return np.asarray(np.random.default_rng(seed).standard_normal(np.shape(y)))


# ---------------------------------------------------------------------------- kernel vs reference

@pytest.mark.parametrize("prim", PRIMITIVES, ids=lambda p: p.id)
def test_kernel_forward_matches_reference(prim, partitions):
    t32 = _f32(prim.inputs())
    want = prim.ref_forward({k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in t32.items()})
    got = prim.kernel_forward(t32)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        _assert_close(g, w, prim.tol, f"{prim.id} output {i}")


def _kernel_grads(prim, t32, dy32, accumulate, input_grads_none=False, seed=2):
    rng = np.random.default_rng(seed)
    start = {}
    grads = {}
    for name in prim.input_grads:
        if input_grads_none:
            grads[name] = None
            continue
        start[name] = rng.standard_normal(t32[name].shape).astype(F32) if accumulate else None
        grads[name] = start[name].copy() if accumulate else np.full(t32[name].shape, np.nan, F32)
    for name in prim.param_grads:
        grads[name] = np.full(t32[name].shape, np.nan, F32)
    prim.kernel_backward(t32, dy32, grads, accumulate)
    return grads, start


@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
@pytest.mark.parametrize("prim", DIFFERENTIABLE, ids=lambda p: p.id)
def test_kernel_backward_matches_reference(prim, accumulate, partitions):
    t32 = _f32(prim.inputs())
    t64 = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in t32.items()}
    dy32 = _dy(prim, t64).astype(F32)
    want = prim.ref_backward(t64, dy32.astype(np.float64))
    grads, start = _kernel_grads(prim, t32, dy32, accumulate)
    for name in prim.input_grads:
        expected = want[name] + (start[name] if accumulate else 0.0)
        _assert_close(grads[name], expected, prim.tol, f"{prim.id} d{name}")
    for name in prim.param_grads:
        _assert_close(grads[name], want[name], prim.tol, f"{prim.id} d{name} (always overwritten)")


@pytest.mark.parametrize("prim", [p for p in DIFFERENTIABLE if p.input_grads], ids=lambda p: p.id)
def test_kernel_backward_without_input_gradient(prim):
    t32 = _f32(prim.inputs())
    t64 = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in t32.items()}
    dy32 = _dy(prim, t64).astype(F32)
    want = prim.ref_backward(t64, dy32.astype(np.float64))
    grads, _ = _kernel_grads(prim, t32, dy32, accumulate=False, input_grads_none=True)
    for name in prim.param_grads:
        _assert_close(grads[name], want[name], prim.tol, f"{prim.id} d{name} with dx=None")


@pytest.mark.parametrize("prim", DIFFERENTIABLE, ids=lambda p: p.id)
def test_thread_pool_gives_the_same_bits(prim, monkeypatch):
    """Partial sums and BLAS row blocks follow the thread count only; the size threshold just
    decides whether the partitions run concurrently."""
    t32 = _f32(prim.inputs())
    dy32 = _dy(prim, {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in t32.items()}).astype(F32)

    def run():
        return prim.kernel_forward(t32), _kernel_grads(prim, t32, dy32, accumulate=True)[0]

    calling_thread = run()
    monkeypatch.setattr(_misc, "PARALLEL_MIN_ELEMENTS", 1)
    thread_pool = run()
    for a, b in zip(calling_thread[0], thread_pool[0]):
        np.testing.assert_array_equal(a, b, err_msg=f"{prim.id} forward")
    for name, grad in calling_thread[1].items():
        np.testing.assert_array_equal(grad, thread_pool[1][name], err_msg=f"{prim.id} d{name}")


# ---------------------------------------------------------------------------- reference vs finite differences

FD_STEP = 1e-6


@pytest.mark.parametrize("prim", [p for p in DIFFERENTIABLE if p.finite_differences], ids=lambda p: p.id)
def test_reference_gradient_matches_finite_differences(prim):
    t = prim.inputs(seed=3)
    dy = _dy(prim, t, seed=4)
    analytic = prim.ref_backward(t, dy)

    def loss(tt):
        return float(np.sum(prim.ref_forward(tt)[0] * dy))

    for name in prim.input_grads + prim.param_grads:
        numeric = np.zeros_like(t[name])
        for idx in np.ndindex(t[name].shape):
            plus, minus = dict(t), dict(t)
            plus[name], minus[name] = t[name].copy(), t[name].copy()
            plus[name][idx] += FD_STEP
            minus[name][idx] -= FD_STEP
            numeric[idx] = (loss(plus) - loss(minus)) / (2 * FD_STEP)
        np.testing.assert_allclose(analytic[name], numeric, rtol=1e-5, atol=1e-6, err_msg=f"{prim.id} d{name}")


# ---------------------------------------------------------------------------- stateful and special semantics

def test_dropout_mask_is_the_counter_hash():
    """Golden values pin the hash so that the CUDA kernel can be checked against them."""
    u = R.dropout_uniform(1, 2, np.arange(3))
    np.testing.assert_array_equal(u, [0.3922164624235318, 0.08471148009289708, 0.842210508356803])
    assert R.dropout_uniform(1, 3, np.arange(3)).tolist() != u.tolist()
    assert R.dropout_uniform(2, 2, np.arange(3)).tolist() != u.tolist()
    many = R.dropout_uniform(5, 0, np.arange(100000))
    assert 0.0 <= many.min() and many.max() < 1.0 and abs(many.mean() - 0.5) < 0.005
    mask = R.dropout_mask((100000,), 0.3, 5, 0)
    assert abs(mask.mean() - 0.7) < 0.005


def test_dropout_kernel_draws_the_reference_mask_for_large_seeds_and_steps():
    x = np.ones(1000, F32)
    y, mask = np.empty_like(x), np.empty(1000, np.uint8)
    for seed, step in [(0, 0), (2**63 + 5, 10**12), (-1, 3)]:
        K.dropout_forward(x, y, mask, 0.5, seed, step)
        np.testing.assert_array_equal(mask, R.dropout_mask((1000,), 0.5, seed, step))
        np.testing.assert_array_equal(y, mask * F32(2.0))


def test_dropout_p_one_zeroes_everything():
    x = np.ones(50, F32)
    y, mask = np.full_like(x, np.nan), np.empty(50, np.uint8)
    K.dropout_forward(x, y, mask, 1.0, 3, 4)
    assert not mask.any() and not y.any()


def test_maxpool_argmax_is_first_maximum_and_indexes_within_sample():
    x = np.zeros((2, 2, 2, 1), F32)      # all ties: the first window element wins
    x[1, 1, 1, 0] = 5.0
    y, am = np.empty((2, 1, 1, 1), F32), np.empty((2, 1, 1, 1), np.int32)
    K.maxpool_forward(x, y, am, 2, 2, 0)
    assert am.ravel().tolist() == [0, 3]
    assert y.ravel().tolist() == [0.0, 5.0]


def test_maxpool_padding_is_minus_infinity():
    x = np.full((1, 2, 2, 1), -7.0, F32)
    y, am = np.empty((1, 2, 2, 1), F32), np.empty((1, 2, 2, 1), np.int32)
    K.maxpool_forward(x, y, am, 2, 1, 1)
    assert (y == -7.0).all()


def test_batchnorm_running_var_is_unbiased_and_momentum_weighted():
    x = np.array([[1.0], [3.0]], F32)
    y, mean, invstd = np.empty_like(x), np.empty(1, F32), np.empty(1, F32)
    rm, rv = np.array([10.0], F32), np.array([4.0], F32)
    K.batchnorm_forward_train(x, np.ones(1, F32), np.zeros(1, F32), y, mean, invstd, rm, rv, 0.25, 0.0)
    assert rm[0] == pytest.approx(0.75 * 10.0 + 0.25 * 2.0)
    assert rv[0] == pytest.approx(0.75 * 4.0 + 0.25 * 2.0)      # unbiased batch variance of {1, 3} is 2
    assert invstd[0] == pytest.approx(1.0)                      # biased variance 1 normalises
    np.testing.assert_allclose(y.ravel(), [-1.0, 1.0])


def test_cross_entropy_grad_scale_scales_only_the_gradient():
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((4, 3)).astype(F32), np.array([0, 2, 1, 1])
    d1, d8 = np.empty_like(logits), np.empty_like(logits)
    loss1 = K.softmax_cross_entropy(logits, labels, 0.1, d1, 1.0)
    loss8 = K.softmax_cross_entropy(logits, labels, 0.1, d8, 8.0)
    assert loss1 == loss8
    np.testing.assert_allclose(d8, 8.0 * d1, rtol=1e-6)


def test_conv_rejects_a_too_small_workspace():
    x, w = np.zeros((1, 4, 4, 2), F32), np.zeros((3, 3, 3, 2), F32)
    with pytest.raises(ValueError, match="im2col workspace needs 288"):
        K.conv2d_forward(x, w, np.empty((1, 4, 4, 3), F32), 1, 1, 1, np.empty(10, F32))


# ---------------------------------------------------------------------------- optimizers

SGD_CONFIGS = [
    dict(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0),
    dict(lr=0.05, momentum=0.9, dampening=0.0, nesterov=False, weight_decay=1e-2),
    dict(lr=0.05, momentum=0.9, dampening=0.3, nesterov=False, weight_decay=0.0),
    dict(lr=0.02, momentum=0.8, dampening=0.0, nesterov=True, weight_decay=5e-3),
]
ADAM_CONFIGS = [
    dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False),
    dict(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1, decoupled=False),
    dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, decoupled=True),
]
OPTIM_STEPS = 4


def _param_and_grads(n=40):
    rng = np.random.default_rng(7)
    return rng.standard_normal(n), [rng.standard_normal(n) for _ in range(OPTIM_STEPS)]


@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=str)
def test_sgd_kernel_matches_reference(cfg, partitions):
    p, grads = _param_and_grads()
    p32, buf32 = p.astype(F32), np.full(p.shape, np.nan, F32)
    buf = np.zeros_like(p)
    for i, g in enumerate(grads):
        p, buf = R.sgd_step(p, g, buf, first_step=i == 0, **cfg)
        K.sgd_step(p32, g.astype(F32), buf32, first_step=i == 0, **cfg)
    np.testing.assert_allclose(p32, p, rtol=1e-5, atol=1e-6)
    if cfg["momentum"]:
        np.testing.assert_allclose(buf32, buf, rtol=1e-5, atol=1e-6)
    assert not np.allclose(p, _param_and_grads()[0])  # the steps moved the parameters


@pytest.mark.parametrize("cfg", ADAM_CONFIGS, ids=str)
def test_adam_kernel_matches_reference(cfg, partitions):
    p, grads = _param_and_grads()
    p32, m32, v32 = p.astype(F32), np.zeros(p.shape, F32), np.zeros(p.shape, F32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    for step, g in enumerate(grads, start=1):
        p, m, v = R.adam_step(p, g, m, v, step=step, **cfg)
        K.adam_step(p32, g.astype(F32), m32, v32, step=step, **cfg)
    np.testing.assert_allclose(p32, p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m32, m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v32, v, rtol=1e-5, atol=1e-6)
