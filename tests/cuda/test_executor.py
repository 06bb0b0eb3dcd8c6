"""CudaExecutor on whole plans: the fused fp16 path against its unfused expansion and against
the fp32 CPU path, tape replay, dynamic loss scaling, and `DeepLearningTask.device("cuda")`.

Two tiny networks cover every fused kind: a ResNet (CBR, BasicBlock identity + projection,
Bottleneck identity + projection, GapFc) and a MobileNetV2-style net (CBR, InvResidual
without a shortcut, with an identity shortcut and with expand ratio 1, GapFc). It does not
downsample: with a stride-2 block before the last one, one of the 512 inputs of the last
block's depthwise ReLU6 lay within fp16 rounding of 0, so its mask bit differed between fp16
and fp32, and the BatchNorm before it (invstd 72, over 16 values) spread that one element into
5-18% of every earlier gradient -- a kink of the network, not of the kernels (found by
comparing every tensor of both paths with separate buffers). Each is trained for two steps
on three executors that start from the same weights: CUDA fused (AMP), CUDA
unfused (AMP) and the CPU reference (fp32). Shapes are 4x4 images (the simulator runs one
Python thread per CUDA thread), batch 4 with one downsampling, so that every BatchNorm
normalises at least 16 values (with two downsamplings, BatchNorms over 2 x 1 x 1 values, the
second step's gradients of the fp16 and fp32 paths differed by tens of percent).

Nothing runs free: before its second step each CUDA executor is loaded with the CPU
reference's parameters and BN statistics (each keeps its own optimizer state, so momentum
is still tested across steps), so every step starts from the same weights on every path.
Two paths left to run free drift apart by the rounding of one step, and a BatchNorm over 16
values amplifies that differently on every machine.

Tolerances: activations are stored in fp16 (2**-11 relative rounding per store), so the
fp16 paths differ from fp32 by a few 1e-3 after a forward and backward through a dozen
layers. Tensors are compared by the 2-norm of their difference, relative to their own norm
with a floor of 1% of the largest norm among the tensors compared (``assert_close``): a gradient
that is zero in exact arithmetic (a bias feeding a linear layer and a BatchNorm) is pure
rounding noise on every path. Losses within 1e-2 relative; the first step's gradients within
``GRAD_TOL``; the second step's update (from identical weights, with each path's own
momentum) within ``UPDATE_TOL``; BN statistics and eval logits within ``GRAD_TOL``. (The
second step's gradients alone are not compared: at its weights some ReLU6 input of
tiny_mobilenet lies within fp16 rounding of a kink, and the BatchNorm backward spreads that
one flipped element to a 6% difference in the first layer's gradient, measured in the
simulator; the update, which carries the first step's momentum, stays within UPDATE_TOL.) The
same-path checks (tape replay, separate buffers) also restart every step from one state, so
that only the order of fp32 atomic adds within that step can differ.
"""
import numpy as np
import pytest

from blueprint import BlockStyle, BluePrint, block, cbr, dropout, fc, gap, gap_fc, maxpool, mbconv, named, seq
from blueprint.optim import SGD, AdamW, CrossEntropyLoss
from cpu_ref import CpuExecutor
from cuda_kernels import CudaExecutor
from planner import ArchPlan
from planner.compiler import Compiler
from tests.support.determinism import contention

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

TINY_RESNET = BluePrint(seq(
    named("conv1", cbr(8, 3, 1, 1)),
    named("layer1", seq(block(8, BlockStyle.RESNET_3_3), block(16, BlockStyle.RESNET_3_3_DS))),
    named("layer2", seq(block(8, 16, BlockStyle.RESNET_1_3_1), block(8, 32, BlockStyle.RESNET_1_3_1))),
    named("fc", gap_fc(5))), "tiny_resnet")
TINY_MOBILENET = BluePrint(seq(cbr(8, 3, 1, 1), mbconv(1, 8, 1), mbconv(2, 16, 1), mbconv(2, 16, 1), gap_fc(8)),
                           "tiny_mobilenet")   # 8 classes: its GapFc runs the tensor-core GEMM; tiny_resnet's 5 the SIMT one
FUSED_KINDS = {"tiny_resnet": {"cbr", "basic_block", "bottleneck", "gap_fc"},
               "tiny_mobilenet": {"cbr", "inv_residual", "gap_fc"}}
NETS = {"tiny_resnet": TINY_RESNET, "tiny_mobilenet": TINY_MOBILENET}
BATCH, HWC, CLASSES, LR = 4, (4, 4, 3), 5, 0.02
GRAD_TOL, UPDATE_TOL = 2e-2, 1e-1   # measured worst (free-running, before the lockstep): 0.5% and 5.2%
# Tiny batches have per-activation gradients near 1: at GradScaler's default scale (2**16) they
# overflow fp16 and the step is (rightly) skipped; the cross-checks use a scale that fits.
CHECK_SCALE = 2.0 ** 12
ATOMICS_RTOL = 1e-5   # runs that must agree but for the order of fp32 atomic adds (BN and conv sums)



def compile_plan(bp, fuse, amp, hwc=HWC, batch=BATCH, eval_batch=BATCH, slots=1):
    arch = ArchPlan.from_blueprint(bp, in_channels=hwc[2], fuse=fuse, amp=amp)
    plan = Compiler(arch).compile({"train": (batch,) + hwc, "eval": (eval_batch,) + hwc},
                                  optimizer_state_slots=slots)
    plan.verify()   # the arena views the executor makes never overlap while live
    return plan


def batches(count, batch=BATCH, hwc=HWC, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch,) + hwc).astype(np.float32), rng.integers(0, CLASSES, batch))
            for _ in range(count)]


def assert_close(got: dict, want: dict, tol: float, label: str):
    """Every tensor: |got - want| <= tol * max(|want|, 1% of the largest |want|) in the 2-norm."""
    assert sorted(got) == sorted(want), label
    norms = {k: float(np.linalg.norm(np.asarray(want[k], np.float64))) for k in want}
    floor = 1e-2 * max(norms.values())
    for k in want:
        error = float(np.linalg.norm(np.asarray(got[k], np.float64) - np.asarray(want[k], np.float64)))
        assert error <= tol * max(norms[k], floor), f"{label} {k}: |difference| {error:.3g}, |reference| {norms[k]:.3g}"


def train(executor, steps, starts=None):
    """`steps` steps; with `starts` (another run's record), step i starts from that run's weights
    before its step i (the executor's own optimizer state carries on)."""
    record = {"loss": [], "correct": [], "starts": [], "grads": []}
    for step, (x, y) in enumerate(batches(steps)):
        if starts is not None:
            executor.load_state_dict(starts["starts"][step])
        record["starts"].append(executor.state_dict())
        record["loss"].append(executor.train_step(x, y, LR))
        record["correct"].append(executor.last_correct)
        record["grads"].append(executor.gradients())
    record["state"] = executor.state_dict()
    record["logits"] = executor.forward(batches(1, seed=7)[0][0])
    return record


@pytest.fixture(scope="class", params=sorted(NETS))
def runs(request):
    """SGD steps (momentum, nesterov, weight decay) of one net: two on the CPU reference and the
    fused CUDA path, one on the unfused CUDA path (its gradients are what the fused kinds are
    checked against)."""
    name, bp = request.param, NETS[request.param]
    optimizer = SGD().momentum(0.9).nesterov(True).weight_decay(1e-3)
    loss = CrossEntropyLoss().label_smoothing(0.1)
    reference = CpuExecutor(compile_plan(bp, fuse=False, amp=False), loss, optimizer, seed=3)
    fused_plan = compile_plan(bp, fuse=True, amp=True)
    kinds = {layer.kind for layer in fused_plan.arch.layers}
    assert FUSED_KINDS[name] <= kinds, f"{name} must exercise {FUSED_KINDS[name] - kinds}"
    out = {"name": name, "cpu": train(reference, 2)}
    for label, plan, steps in (("fused", fused_plan, 2), ("unfused", compile_plan(bp, fuse=False, amp=True), 1)):
        executor = CudaExecutor(plan, loss, optimizer, seed=3, init_loss_scale=CHECK_SCALE)
        out[label] = train(executor, steps, starts=out["cpu"])
        assert not executor.skipped_last_step and executor.loss_scale == CHECK_SCALE
        # the default GEMMs are the tensor-core kernels: no convolution forward is left to the SIMT ones
        launched = executor._runners[("train", "train")].tape.names()
        assert executor.kernels == "mma" and not any(n.startswith("conv2d_forward") for n in launched) and all(
            any(n.startswith(f"mma_conv2d_{p}") for n in launched) for p in ("forward", "backward_data",
                                                                            "backward_weight")), sorted(set(launched))
        classifier_simt = any(n.startswith("linear_forward") for n in launched)
        assert classifier_simt == (name == "tiny_resnet"), sorted(set(launched))
    return out


class TestAgainstTheCpuPath:
    """The cross-checks share one run of each net (one pytest-xdist worker takes the class)."""

    def test_losses_and_accuracy_follow_the_cpu_reference(self, runs):
        got, want = runs["fused"], runs["cpu"]
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-2)
        np.testing.assert_allclose(runs["unfused"]["loss"], want["loss"][:1], rtol=1e-2)
        assert got["loss"][1] != got["loss"][0], "the second step must see updated weights"
        assert sum(got["correct"]) == pytest.approx(sum(want["correct"]), abs=1)

    @pytest.mark.parametrize("path", ["fused", "unfused"])
    def test_every_gradient_follows_the_cpu_reference(self, runs, path):
        assert_close(runs[path]["grads"][0], runs["cpu"]["grads"][0], GRAD_TOL, f"{runs['name']} {path} gradient")

    def test_parameters_and_bn_statistics_after_two_steps_follow_the_cpu_reference(self, runs):
        got, want, start = runs["fused"]["state"], runs["cpu"]["state"], runs["cpu"]["starts"][1]
        assert all(np.array_equal(runs["fused"]["starts"][1][k], start[k]) for k in start), "not in lockstep"
        assert sorted(got) == sorted(want)
        trainable = sorted(runs["cpu"]["grads"][1])
        assert_close({k: got[k] - start[k] for k in trainable}, {k: want[k] - start[k] for k in trainable},
                     UPDATE_TOL, f"{runs['name']} update of")
        statistics = [k for k in want if k.endswith(("running_mean", "running_var"))]
        assert statistics and all(got[k].shape == want[k].shape for k in statistics)
        assert_close({k: got[k] for k in statistics}, {k: want[k] for k in statistics}, GRAD_TOL, runs["name"])
        for name in want:
            if name.endswith("num_batches_tracked"):
                assert got[name] == want[name] == 2, name
        assert_close({"logits": runs["fused"]["logits"]}, {"logits": runs["cpu"]["logits"]}, GRAD_TOL, "eval")

    def test_each_fused_kind_matches_its_unfused_expansion(self, runs):
        """Same plan, same kernels per primitive; the fused ops add the conv-epilogue statistics,
        the fused BN apply (+ residual) (+ ReLU/ReLU6) and the backward recomputation."""
        fused, unfused = runs["fused"], runs["unfused"]
        np.testing.assert_allclose(fused["loss"][:1], unfused["loss"], rtol=5e-3)
        assert_close(fused["grads"][0], unfused["grads"][0], GRAD_TOL, "fused vs unfused gradient")


# ---- tape replay, loss scaling, bad input ----------------------------------------------------------------
SMALL = BluePrint(seq(cbr(8, 3, 1, 1), maxpool(2, 2), dropout(0.25), gap(), fc(CLASSES)), "small")


def test_replaying_the_recorded_step_equals_fresh_eager_launches_every_step():
    """The executor records each step once and replays it; a second executor re-records the
    step every time (a fresh tape, launched at once). Five steps must agree (up to the order in
    which fp32 atomics add): every per-step value (batch, lr, dropout draw, loss scale,
    counters) is read from the arena, none is frozen into the tape."""
    plan = compile_plan(SMALL, fuse=True, amp=True, slots=2)
    replayed, fresh = (CudaExecutor(plan, optimizer=AdamW().weight_decay(1e-2), seed=1, replay="eager",
                                    init_loss_scale=CHECK_SCALE) for _ in range(2))
    for step, (x, y) in enumerate(batches(5, seed=11)):
        fresh._runners.clear()
        fresh.load_state_dict(replayed.state_dict())   # one start: only this step's atomics may differ
        a, b = replayed.train_step(x, y, 1e-2 * (step + 1)), fresh.train_step(x, y, 1e-2 * (step + 1))
        np.testing.assert_allclose(a, b, rtol=ATOMICS_RTOL, err_msg=f"loss of step {step}")
        state_a, state_b = replayed.state_dict(), fresh.state_dict()
        for name in state_a:
            np.testing.assert_allclose(state_a[name], state_b[name], rtol=ATOMICS_RTOL, atol=1e-7,
                                       err_msg=f"{name} after step {step}")
    assert len(replayed._runners) == 1 and len(replayed._runners[("train", "train")].tape) > 20


def test_the_arena_and_separate_buffers_give_identical_results():
    """Every step-local tensor at its planned offset, or in its own allocation: a lifetime or
    offset the plan got wrong, or a kernel touching a tensor its op does not declare, shows."""
    plan = compile_plan(SMALL, fuse=True, amp=True)
    results, starts = [], []
    for separate in (False, True):
        ex = CudaExecutor(plan, seed=4, init_loss_scale=CHECK_SCALE, separate_buffers=separate)
        losses = []
        for step, (x, y) in enumerate(batches(2, seed=8)):
            if separate:   # every step from the arena run's state: only this step's atomics may differ
                ex.load_state_dict(starts[step])
            else:
                starts.append(ex.state_dict())
            losses.append(ex.train_step(x, y, 0.05))
        results.append((losses, ex.forward(batches(1, seed=9)[0][0]), ex.state_dict()))
    (loss_a, logits_a, state_a), (loss_b, logits_b, state_b) = results
    np.testing.assert_allclose(loss_a, loss_b, rtol=ATOMICS_RTOL)
    np.testing.assert_allclose(logits_a, logits_b, rtol=ATOMICS_RTOL, atol=1e-3)   # fp16 logits: one ulp
    for name in state_a:
        np.testing.assert_allclose(state_a[name], state_b[name], rtol=ATOMICS_RTOL, atol=1e-7, err_msg=name)


def test_an_overflowing_step_is_skipped_halves_the_scale_and_leaves_parameters_untouched():
    plan = compile_plan(SMALL, fuse=True, amp=True)
    ex = CudaExecutor(plan, optimizer=SGD().momentum(0.9), seed=2, init_loss_scale=CHECK_SCALE)
    (x, y), (x2, y2) = batches(2, seed=4)
    ex.train_step(x, y, 0.1)
    assert not ex.skipped_last_step and ex.loss_scale == CHECK_SCALE
    state = ex.state_dict()
    momentum = ex.optimizer_state()
    poisoned = dict(state, **{"4.weight": np.full_like(state["4.weight"], 1e30)})  # its fp16 copy is inf
    ex.load_state_dict(poisoned)
    loss = ex.train_step(x2, y2, 0.1)
    assert not np.isfinite(loss)
    assert ex.skipped_last_step and ex.loss_scale == CHECK_SCALE / 2
    after = ex.state_dict()
    for name in state:
        if not name.endswith(("running_mean", "running_var", "num_batches_tracked")):
            np.testing.assert_array_equal(after[name], poisoned[name], err_msg=f"{name} changed in a skipped step")
    for name, value in ex.optimizer_state().items():
        if name.startswith("state"):
            np.testing.assert_array_equal(value, momentum[name], err_msg=f"{name} changed in a skipped step")
    ex.load_state_dict(state)                       # healthy weights: the next step updates again
    ex.train_step(x, y, 0.1)
    assert not ex.skipped_last_step and ex.loss_scale == CHECK_SCALE / 2
    assert not np.array_equal(ex.state_dict()["4.weight"], state["4.weight"])


def test_bad_input_is_refused_before_anything_runs():
    plan = compile_plan(SMALL, fuse=True, amp=True)
    ex = CudaExecutor(plan, seed=0)
    before = ex.state_dict()
    (x, y), = batches(1)
    for bad_x, bad_y, fragment in [(x[..., :2], y, "variant"), (x.astype(np.float64), y, "float32"),
                                   (np.where(x > 1, np.nan, x).astype(np.float32), y, "NaN"),
                                   (x, np.array([0, 1, 2, CLASSES]), "labels must be in")]:
        with pytest.raises(ValueError, match=fragment):
            ex.train_step(bad_x, bad_y, 0.1)
    after = ex.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_dropout_gradients_follow_the_cpu_reference(p):
    """Both paths draw the same mask (one counter-based hash); p = 0 still writes an all-ones mask."""
    bp = BluePrint(seq(cbr(8, 3, 1, 1), dropout(p), gap_fc(CLASSES)))
    cpu = CpuExecutor(compile_plan(bp, fuse=False, amp=False), seed=6)
    ex = CudaExecutor(compile_plan(bp, fuse=True, amp=True), seed=6, init_loss_scale=CHECK_SCALE)
    (x, y), = batches(1, seed=12)
    np.testing.assert_allclose(ex.train_step(x, y, 0.0), cpu.train_step(x, y, 0.0), rtol=1e-2)
    got, want = ex.gradients(), cpu.gradients()
    assert all(np.abs(want[k]).max() > 0 for k in want)
    assert_close(got, want, GRAD_TOL, f"dropout({p}) gradient")


def test_fp32_plans_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="amp=True"):
        CudaExecutor(compile_plan(SMALL, fuse=False, amp=False))


def test_weights_move_between_the_cpu_and_cuda_paths_by_name():
    cpu = CpuExecutor(compile_plan(SMALL, fuse=False, amp=False), seed=8)
    ex = CudaExecutor(compile_plan(SMALL, fuse=True, amp=True), seed=99)
    ex.load_state_dict(cpu.state_dict())
    x, _ = batches(1, seed=5)[0]
    assert_close({"logits": ex.forward(x)}, {"logits": cpu.forward(x)}, GRAD_TOL, "after loading CPU weights:")
    for name, value in cpu.state_dict().items():
        np.testing.assert_array_equal(ex.state_dict()[name], value, err_msg=name)


# ---- the task ----------------------------------------------------------------------------------------------
def test_the_task_trains_on_the_cuda_path_end_to_end(tmp_path):
    from blueprint.task import DeepLearningTask
    from blueprint.task.data import synthetic

    train, val = synthetic(24, (4, 4, 1), num_classes=3, seed=0), synthetic(6, (4, 4, 1), num_classes=3, seed=1)
    task = (DeepLearningTask().model(BluePrint(seq(cbr(8, 3, 1, 1), gap_fc(3))))
            .optimizer(SGD().momentum(0.9)).data(train=train, val=val, batch_size=8)
            .epochs(2).device("cuda").seed(0).checkpoint(str(tmp_path / "ckpt.safetensors")))
    history = task.fit()
    session = task.session()
    assert isinstance(session.executor, CudaExecutor)
    assert session.plan.arch.fuse and session.plan.arch.amp
    assert [r.epoch for r in history] == [1, 2]
    assert all(np.isfinite(r.train_loss) and r.val_accuracy is not None for r in history)
    assert history[1].train_loss < history[0].train_loss
    assert (tmp_path / "ckpt.safetensors").exists()


# ---- transfers on the step's stream, pipelined steps, capture fallback (issue 11, items 2-3) -----------------
def _touches(entry, span):
    from cuda_kernels.tape import device_span
    return any(hasattr(a, "shape") and not isinstance(a, np.ndarray) and
               device_span(a)[0] < span[1] and span[0] < device_span(a)[1] for a in entry.args)


@pytest.mark.parametrize("purpose", ["train", "eval", "forward"])
def test_a_recorded_step_orders_every_transfer_on_the_stream(purpose):
    """On the tape (the stream's order): each upload before the first kernel touching its slot, the
    "uploaded" event before any kernel, each download after the last kernel touching its slot, and the
    "done" event (what the host waits on) after every download."""
    from cuda_kernels.executor import STEP_INPUTS, STEP_OUTPUTS
    from cuda_kernels.tape import device_span
    plan = compile_plan(SMALL, fuse=True, amp=True)
    ex = CudaExecutor(plan, seed=0, init_loss_scale=CHECK_SCALE)
    (x, y), = batches(1)
    {"train": lambda: ex.train_step(x, y, 0.1), "eval": lambda: ex.evaluate_batch(x, y),
     "forward": lambda: ex.forward(x)}[purpose]()
    variant = next(v for v, p in ex._runners if p == purpose)
    entries = list(ex._runners[(variant, purpose)].tape)
    kinds = [e.kind for e in entries]
    kernels = [i for i, kind in enumerate(kinds) if kind == "kernel"]
    uploads = {e.name: i for i, e in enumerate(entries) if e.kind == "upload"}
    downloads = {e.name: i for i, e in enumerate(entries) if e.kind == "download"}
    assert sorted(uploads) == sorted(STEP_INPUTS[purpose]) and sorted(downloads) == sorted(STEP_OUTPUTS[purpose])
    for name, at in uploads.items():
        span = device_span(entries[at].slot.view)
        readers = [i for i in kernels if _touches(entries[i], span)]
        assert readers, f"no kernel reads the uploaded slot {name!r}"
        assert at < readers[0], f"{name!r} is uploaded at {at}, after kernel {readers[0]} read it"
    for name, at in downloads.items():
        span = device_span(entries[at].slot.view)
        writers = [i for i in kernels if _touches(entries[i], span)]
        assert writers, f"no kernel writes the downloaded slot {name!r}"
        assert at > writers[-1], f"{name!r} is downloaded at {at}, before kernel {writers[-1]} wrote it"
    uploaded = kinds.index("event")
    assert entries[uploaded].name == "uploaded" and max(uploads.values()) < uploaded < kernels[0]
    assert (kinds[-1], entries[-1].name) == ("event", "done") and max(downloads.values()) < len(entries) - 1


def test_the_host_reads_a_result_only_after_waiting_on_its_event():
    plan = compile_plan(SMALL, fuse=True, amp=True)
    ex = CudaExecutor(plan, seed=0, init_loss_scale=CHECK_SCALE)
    (x, y), = batches(1)
    ex.train_step(x, y, 0.1)                     # records the step
    staging = next(iter(ex._staging.values()))
    staging.trace = []
    ex.train_step(x, y, 0.1)
    assert staging.trace == [("host_wait", "uploaded"), ("upload", "input"), ("upload", "labels"), ("upload", "lr"),
                             ("event", "uploaded"), ("download", "loss"), ("download", "correct"),
                             ("event", "done"), ("host_wait", "done"), ("host_read", "loss,correct")]


def test_pipelined_steps_equal_one_step_at_a_time():
    """``train_steps`` submits step k+1 before reading step k (double-buffered staging): same losses,
    counts and weights as ``train_step`` one at a time, lr changing every step. Run under forced thread
    switches: on a loaded machine this test once ended with other weights (the simulator's shared-array
    race, ``cuda_kernels/_simulator.py``); contention makes such a race show in every run."""
    plan = compile_plan(SMALL, fuse=True, amp=True)
    one, piped = (CudaExecutor(plan, optimizer=SGD().momentum(0.9), seed=5, init_loss_scale=CHECK_SCALE)
                  for _ in range(2))
    data = [(x, y, 0.05 * (i + 1)) for i, (x, y) in enumerate(batches(4, seed=21))]
    with contention():
        want = [(one.train_step(x, y, lr), one.last_correct) for x, y, lr in data]
        got = list(piped.train_steps(iter(data)))
    np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], rtol=ATOMICS_RTOL)
    assert [g[1] for g in got] == [w[1] for w in want] and piped.step_count == one.step_count == 4
    device_steps = [int(ex.optimizer_state()["amp.step"][0]) for ex in (one, piped)]
    assert device_steps == [4, 4], f"updates applied (a skipped step is not one): {device_steps}"
    assert len({loss for loss, _ in got}) == 4, "every step must see its own batch and weights"
    state_a, state_b = one.state_dict(), piped.state_dict()
    for name in state_a:
        np.testing.assert_allclose(state_b[name], state_a[name], rtol=ATOMICS_RTOL, atol=1e-7, err_msg=name)


def test_a_result_read_after_its_buffers_were_reused_is_refused():
    ex = CudaExecutor(compile_plan(SMALL, fuse=True, amp=True), seed=0, init_loss_scale=CHECK_SCALE)
    (x, y), = batches(1)
    pending = [ex.submit_train_step(x, y, 0.1) for _ in range(3)]
    assert np.isfinite(pending[2].result()[0]) and np.isfinite(pending[1].result()[0])
    with pytest.raises(RuntimeError, match="overwritten by step 2"):
        pending[0].result()


def test_a_failed_capture_falls_back_to_eager_and_the_executor_says_so(monkeypatch):
    """Capture raising (monkeypatched: the simulator has no graphs): one warning, the same results as
    eager replay, and ``replay_in_use`` names the fallback (gpu_check prints it)."""
    from cuda_kernels import graph

    def refuse(kernels):
        raise RuntimeError("capture refused (test)")
    monkeypatch.setattr(graph, "graph_support", lambda: (True, ""))
    monkeypatch.setattr(graph, "capture_graph", refuse)
    plan = compile_plan(SMALL, fuse=True, amp=True)
    graphed, eager = (CudaExecutor(plan, seed=2, replay=mode, init_loss_scale=CHECK_SCALE) for mode in ("graph", "eager"))
    assert graphed.replay_in_use == "graph" and eager.replay_in_use == "eager"
    data = batches(3, seed=3)
    with pytest.warns(graph.GraphCaptureWarning) as caught:
        got = [graphed.train_step(x, y, 0.1) for x, y in data]
    assert len([w for w in caught if issubclass(w.category, graph.GraphCaptureWarning)]) == 1
    want = [eager.train_step(x, y, 0.1) for x, y in data]
    np.testing.assert_allclose(got, want, rtol=ATOMICS_RTOL)
    assert graphed.replay_in_use.startswith("eager (fell back: graph capture failed (RuntimeError: capture refused")


def test_gpu_checks_breakdown_times_every_entry_of_a_real_step():
    """benchmarks/gpu/check.py's per-kernel breakdown on a recorded step (the simulator's events carry
    no times: the entries, their order and the step's result are what is checked here)."""
    from benchmarks.gpu.protocol import summed_by_kind, timed_replay
    from numba import cuda
    ex = CudaExecutor(compile_plan(SMALL, fuse=True, amp=True), seed=0, init_loss_scale=CHECK_SCALE)
    (x, y), = batches(1)
    want = ex.train_step(x, y, 0.1)
    key = next(iter(ex._staging))
    staging, tape = ex._staging[key], ex._runners[key].tape
    turn = staging.begin({"input": x, "labels": y, "lr": 0.1})
    timed = timed_replay(list(tape), ex.stream, cuda.event)
    assert [(kind, name) for kind, name, _ in timed] == tape.entries()
    rows = summed_by_kind(timed)
    assert sum(count for _, count, _, _ in rows) == len(timed)
    assert {"(uploads)", "(downloads)", "(events)"} | set(tape.names()) == {name for name, _, _, _ in rows}
    loss = float(staging.result(turn)["loss"][0])
    assert np.isfinite(loss) and loss != want, "the timed replay is a real step (its weights moved)"
