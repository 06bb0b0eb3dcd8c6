"""A whole tiny training step in one arena: tape replay against eager launches, and
dynamic loss scaling skipping a step whose gradients overflow."""
import numpy as np
import pytest
from numba import cuda

from planner import reference as ref
from planner.ops import Prim
from cuda_kernels import batchnorm, _conv, elementwise, _linear, loss, optim, pool
from cuda_kernels.arena import DeviceArena
from cuda_kernels.tape import Immediate, LaunchTape

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
PARAM_ALIGN = 512   # fp32 params 512-aligned, so their fp16 mirrors (half the offset) stay 256-aligned
SLOT_ALIGN = 256


class Layout:
    """A bump allocator standing in for the MemoryPlan: name -> (offset, shape, dtype)."""

    def __init__(self):
        self.slots, self.end = {}, 0

    def add(self, name, shape, dtype, align=SLOT_ALIGN):
        offset = -(-self.end // align) * align
        self.slots[name] = (offset, shape, np.dtype(dtype))
        self.end = offset + int(np.prod(shape)) * np.dtype(dtype).itemsize
        return offset

    def region(self, name, members, dtype, like=None):
        """Members in one contiguous region (PARAM_ALIGN apart), as named sub-slots. With
        ``like``, member ``i`` sits at the same *element* offset as in region ``like``, so one
        elementwise launch over the region (the fp16 cast) maps every member onto its mirror."""
        itemsize = np.dtype(dtype).itemsize
        start = self.add(name, 0, dtype, PARAM_ALIGN)
        if like is not None:
            base, (size,), like_dtype = self.slots[like]
            for (member, shape), (like_member, _) in zip(members, PARAMS):
                element = (self.slots[like_member][0] - base) // like_dtype.itemsize
                self.slots[member] = (start + element * itemsize, shape, np.dtype(dtype))
            self.end = start + size * itemsize
        for member, shape in members if like is None else ():
            self.add(member, shape, dtype, PARAM_ALIGN)
        self.slots[name] = (start, ((self.end - start) // itemsize,), np.dtype(dtype))


PARAMS = [("conv_w", (4, 3, 3, 3)), ("bn_gamma", (4,)), ("bn_beta", (4,)), ("fc_w", (5, 4)), ("fc_b", (5,))]
P = 0.25        # dropout
SEED = 1234


def build_layout():
    layout = Layout()
    layout.region("params", PARAMS, np.float32)
    layout.region("grads", [("d_" + n, s) for n, s in PARAMS], np.float32, like="params")
    layout.region("momentum", [("m_" + n, s) for n, s in PARAMS], np.float32, like="params")
    layout.region("params16", [(n + "16", s) for n, s in PARAMS], np.float16, like="params")
    for name, shape, dtype in [
            ("x", (2, 4, 4, 3), np.float16), ("labels", (2,), np.int32),
            ("conv_out", (2, 4, 4, 4), np.float16), ("save_mean", (4,), np.float32),
            ("save_invstd", (4,), np.float32), ("running_mean", (4,), np.float32),
            ("running_var", (4,), np.float32), ("bn_out", (2, 4, 4, 4), np.float16),
            ("drop_out", (2, 4, 4, 4), np.float16), ("mask", (2, 4, 4, 4), np.uint8),
            ("pooled", (2, 4), np.float16), ("logits", (2, 5), np.float16), ("loss", (1,), np.float32),
            ("d_logits", (2, 5), np.float16), ("d_pooled", (2, 4), np.float16),
            ("d_drop_out", (2, 4, 4, 4), np.float16), ("d_bn_out", (2, 4, 4, 4), np.float16),
            ("d_conv_out", (2, 4, 4, 4), np.float16),
            ("lr", (1,), np.float32), ("step", (1,), np.int32), ("iteration", (1,), np.int32),
            ("loss_scale", (1,), np.float32), ("found_inf", (1,), np.int32), ("growth_tracker", (1,), np.int32)]:
        layout.add(name, shape, dtype)
    return layout


def make_arena(layout, rng):
    arena = DeviceArena(layout.end)
    arena.zero()
    init = {"conv_w": rng.standard_normal((4, 3, 3, 3)) * 0.3, "bn_gamma": np.ones(4), "bn_beta": np.zeros(4),
            "fc_w": rng.standard_normal((5, 4)) * 0.5, "fc_b": rng.standard_normal(5) * 0.1,
            "x": rng.standard_normal((2, 4, 4, 3)), "labels": np.array([1, 3]), "running_var": np.ones(4),
            "lr": [0.1], "loss_scale": [2.0 ** 16]}
    for name, value in init.items():
        offset, shape, dtype = layout.slots[name]
        arena.upload(offset, np.asarray(value, dtype).reshape(shape), stream=0)   # the default stream, like the launches here
    views = {name: arena.view(*slot) for name, slot in layout.slots.items()}
    elementwise.cast_f32_to_f16(Immediate(), views["params"], views["params16"])
    cuda.synchronize()
    return arena, views


def record_step(launcher, v):
    """Forward, loss, backward, overflow check, SGD, loss-scale update, counters, fp16 copies."""
    flat = lambda name: v[name].reshape(32, 4)   # noqa: E731  (the (M, C) view of a (2, 4, 4, 4) tensor)
    _conv.conv2d_forward(launcher, v["x"], v["conv_w16"], v["conv_out"], 1, 1, 1,
                         bn_sums=(v["save_mean"], v["save_invstd"]))
    batchnorm.batchnorm_forward_train(launcher, flat("conv_out"), v["bn_gamma"], v["bn_beta"], flat("bn_out"),
                                       v["save_mean"], v["save_invstd"], v["running_mean"], v["running_var"],
                                       0.1, 1e-5, activation="relu", sums_ready=True)
    elementwise.dropout_forward(launcher, v["bn_out"], v["drop_out"], v["mask"], P, SEED, v["iteration"])
    pool.gap_forward(launcher, v["drop_out"], v["pooled"])
    _linear.linear_forward(launcher, v["pooled"], v["fc_w16"], v["fc_b"], v["logits"])
    loss.softmax_cross_entropy(launcher, v["logits"], v["labels"], 0.1, v["loss"], v["d_logits"], v["loss_scale"])
    _linear.linear_backward(launcher, v["pooled"], v["fc_w16"], v["d_logits"], v["d_pooled"], v["d_fc_w"],
                            v["d_fc_b"], False)
    pool.gap_backward(launcher, v["d_pooled"], v["d_drop_out"], False)
    elementwise.dropout_backward(launcher, v["mask"], v["d_drop_out"], v["d_bn_out"], P, False)
    elementwise.activation_backward(launcher, Prim.RELU, v["bn_out"], v["d_bn_out"], v["d_bn_out"])
    batchnorm.batchnorm_backward(launcher, flat("conv_out"), v["bn_gamma"], v["save_mean"], v["save_invstd"],
                                  flat("d_bn_out"), flat("d_conv_out"), v["d_bn_gamma"], v["d_bn_beta"], False,
                                  eps=1e-5)
    _conv.conv2d_backward(launcher, v["x"], v["conv_w16"], v["d_conv_out"], None, v["d_conv_w"], 1, 1, 1, False)
    optim.check_overflow(launcher, v["grads"], v["found_inf"])
    optim.sgd_step(launcher, v["params"], v["grads"], v["momentum"], v["lr"], v["step"], v["loss_scale"],
                    v["found_inf"], 0.9, 0.0, False, 1e-4)
    optim.update_loss_scale(launcher, v["found_inf"], v["loss_scale"], v["growth_tracker"])
    optim.advance_counters(launcher, v["found_inf"], v["step"], v["iteration"])
    elementwise.cast_f32_to_f16(launcher, v["params"], v["params16"])


def snapshot(v):
    return {name: v[name].copy_to_host() for name in
            ("params", "momentum", "running_mean", "running_var", "loss", "mask", "step", "iteration",
             "loss_scale", "found_inf", "growth_tracker")}


EXACT = ("mask", "step", "iteration", "loss_scale", "found_inf", "growth_tracker")


def test_tape_replay_equals_eager_launches_every_step():
    layout = build_layout()
    eager_arena, eager = make_arena(layout, np.random.default_rng(7))
    tape_arena, taped = make_arena(layout, np.random.default_rng(7))
    tape = LaunchTape()
    record_step(tape, taped)
    previous = snapshot(taped)
    for step in range(5):
        # both start the step from the taped arena's bytes: only this step's atomics may add in
        # another order (five free-running steps would compound that through the BatchNorm)
        eager_arena.buffer.copy_to_device(tape_arena.buffer)
        record_step(Immediate(), eager)
        tape.replay()
        cuda.synchronize()
        want, got = snapshot(eager), snapshot(taped)
        for name in want:
            if name in EXACT:
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} after step {step}")
            else:   # fp32 atomics may add in another order
                np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6,
                                           err_msg=f"{name} after step {step}")
        assert got["step"][0] == got["iteration"][0] == step + 1
        assert not np.array_equal(got["params"], previous["params"]), "the step did not update the parameters"
        assert not np.array_equal(got["mask"], previous["mask"]), "dropout must draw a new mask every step"
        np.testing.assert_array_equal(got["mask"], ref.dropout_mask((2, 4, 4, 4), P, SEED, step))
        previous = got


def test_overflow_in_the_batch_skips_the_whole_update():
    layout = build_layout()
    arena, v = make_arena(layout, np.random.default_rng(3))
    tape = LaunchTape()
    record_step(tape, v)
    tape.replay()                                   # one clean step
    cuda.synchronize()
    before = snapshot(v)
    x = v["x"].copy_to_host()
    x[1, 2, 2, 0] = np.inf
    arena.upload(layout.slots["x"][0], x, stream=0)
    tape.replay()
    cuda.synchronize()
    after = snapshot(v)
    assert after["found_inf"][0] == 1
    for name in ("params", "momentum", "step"):
        np.testing.assert_array_equal(after[name], before[name], err_msg=f"{name} changed in a skipped step")
    assert after["loss_scale"][0] == before["loss_scale"][0] / 2
    assert after["growth_tracker"][0] == 0 and after["iteration"][0] == before["iteration"][0] + 1


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_injected_inf_in_gradients_skips_step_and_halves_scale(optimizer):
    rng = np.random.default_rng(5)
    n, scale, lr = 37, 2.0 ** 16, 0.01
    p = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * scale).astype(np.float32)
    g_bad = g.copy()
    g_bad[5] = np.inf
    d = {name: cuda.to_device(a) for name, a in dict(
        p=p, g=g_bad, s1=np.zeros(n, np.float32), s2=np.zeros(n, np.float32), p16=np.zeros(n, np.float16),
        lr=np.array([lr], np.float32), step=np.array([3], np.int32), iteration=np.array([9], np.int32),
        scale=np.array([scale], np.float32), found_inf=np.zeros(1, np.int32),
        tracker=np.array([7], np.int32)).items()}
    tape = LaunchTape()
    optim.check_overflow(tape, d["g"], d["found_inf"])
    if optimizer == "sgd":
        optim.sgd_step(tape, d["p"], d["g"], d["s1"], d["lr"], d["step"], d["scale"], d["found_inf"],
                        0.9, 0.0, True, 1e-4)
    else:
        optim.adam_step(tape, d["p"], d["g"], d["s1"], d["s2"], d["lr"], d["step"], d["scale"], d["found_inf"],
                         0.9, 0.999, 1e-8, 1e-2, True)
    optim.update_loss_scale(tape, d["found_inf"], d["scale"], d["tracker"])
    optim.advance_counters(tape, d["found_inf"], d["step"], d["iteration"])
    elementwise.cast_f32_to_f16(tape, d["p"], d["p16"])
    host = lambda name: d[name].copy_to_host()   # noqa: E731

    tape.replay()
    cuda.synchronize()
    assert host("found_inf")[0] == 1
    np.testing.assert_array_equal(host("p"), p)
    np.testing.assert_array_equal(host("s1"), 0)
    np.testing.assert_array_equal(host("p16"), p.astype(np.float16))
    assert (host("scale")[0], host("tracker")[0], host("step")[0], host("iteration")[0]) == (scale / 2, 0, 3, 10)

    d["g"].copy_to_device(g)                      # the next step's gradients are finite again
    tape.replay()
    cuda.synchronize()
    assert host("found_inf")[0] == 0
    if optimizer == "sgd":   # step 3 > 0: not the first step, so buf = momentum * 0 + d
        expected, _ = ref.sgd_step(p.astype(np.float64), g / (scale / 2), np.zeros(n), lr, 0.9, 0.0, True, 1e-4, False)
    else:                    # Adam's step 4 (three earlier steps completed)
        expected, _, _ = ref.adam_step(p.astype(np.float64), g / (scale / 2), np.zeros(n), np.zeros(n), lr, 0.9,
                                       0.999, 1e-8, 1e-2, 4, True)
    np.testing.assert_allclose(host("p"), expected, rtol=1e-5, atol=1e-6)
    assert (host("scale")[0], host("tracker")[0], host("step")[0], host("iteration")[0]) == (scale / 2, 1, 4, 11)
