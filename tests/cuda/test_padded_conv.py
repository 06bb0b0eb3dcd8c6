"""Convolutions with ``Cin % 8 != 0`` that are not a stem on the padded input slot, on the aligned tensor-core path
(issue 23; ``cuda_kernels/padded_conv.py``), in the simulator.

Two networks, each checked against the fp32 CPU path from the same weights and batch (loss, every gradient, the
update of every parameter, the eval logits):

- ``interior``: the stem (3 channels, on the padded input slot), then a CBR of 8 -> 12 channels and one of 12 -> 8:
  the latter reads 12 channels, so it pads them into its own 16-channel workspace in forward and backward, runs the
  aligned forward, weight gradient and input gradient with an fp16 weight copy of 16 channels (zero columns), and
  writes the input gradient's 12 real channels into ``dx``;
- ``shared``: the network input is read by a 3 -> 3 convolution and by the residual add after it, so the input slot
  keeps 3 channels and that convolution pads its input into a workspace (its backward, ``Cout % 8 != 0``, runs
  SIMT on the real channels); the 3 -> 8 CBR after the add pads too, and its input gradient reaches the first one.

The step must launch no any-channel kernel and no SIMT convolution forward. The master weights, their gradients,
the optimizer state and ``state_dict`` keep the real channels; the padded copies' extra columns are zero. Every
planned (step-local) byte of the arena is poisoned (0xff: fp16 NaN) before the train step: a workspace whose padded
channels the pad kernel did not zero would carry the NaN to the loss (NaN x a zero weight column is NaN).
Tolerances as ``test_executor`` (fp16 activations; a BN over 32 values).
"""
import numpy as np
import pytest

from blueprint import BluePrint, add2, bn, cbr, conv, gap_fc, identity, named, relu, seq
from blueprint.optim import SGD, CrossEntropyLoss
from cpu_ref import CpuExecutor
from cuda_kernels import CudaExecutor
from planner.plan import Role
from tests.cuda.test_executor import CHECK_SCALE, GRAD_TOL, assert_close, compile_plan

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
BATCH, CLASSES, LR, HWC = 2, 8, 0.05, (4, 4, 3)
NETS = {   # the network, and its padded convolutions: weight -> (real channels, padded channels, has a workspace)
    "interior": (seq(named("conv1", cbr(8, 3, 1, 1)), named("mid", seq(conv(12, 3, 1, 1), bn(), relu())),
                     named("conv2", seq(conv(8, 3, 1, 1), bn(), relu())), named("fc", gap_fc(CLASSES))),
                 {"conv1.0.weight": (3, 8, False), "conv2.0.weight": (12, 16, True)}),
    "shared": (seq(named("res", add2(identity(), seq(conv(3, 3, 1, 1), bn()))),
                   named("conv2", seq(conv(8, 3, 1, 1), bn(), relu())), named("fc", gap_fc(CLASSES))),
               {"res.1.0.weight": (3, 8, True), "conv2.0.weight": (3, 8, True)}),
}


@pytest.fixture(scope="module", params=sorted(NETS))
def net(request):
    bp = BluePrint(NETS[request.param][0], "padded_net")
    optimizer, loss = SGD().momentum(0.9).weight_decay(1e-3), CrossEntropyLoss()
    cpu = CpuExecutor(compile_plan(bp, fuse=False, amp=False, hwc=HWC, batch=BATCH, eval_batch=BATCH), loss,
                      optimizer, seed=4)
    plan = compile_plan(bp, fuse=True, amp=True, hwc=HWC, batch=BATCH, eval_batch=BATCH)
    cuda = CudaExecutor(plan, loss, optimizer, seed=4, init_loss_scale=CHECK_SCALE)
    return request.param, plan, cpu, cuda


def _batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH,) + HWC).astype(np.float32), rng.integers(0, CLASSES, BATCH)


def _poison_planned_memory(cuda, plan):
    """0xff in every byte of the saved and transient regions (fp16 and fp32 NaN): what a step reads there before
    writing it becomes NaN."""
    for region in ("saved", "transient"):
        start, nbytes = plan.memory.regions[region]
        if nbytes:
            cuda._upload(cuda.arena.view(start, (nbytes,), np.uint8), np.full(nbytes, 0xff, np.uint8))


def _step(executor, start, x, y, poison=None):
    """From the weights ``start``: the eval logits of ``x``, then one training step's loss, gradients and the
    update of every parameter."""
    executor.load_state_dict(start)
    logits = executor.forward(x)
    if poison:
        poison()
    loss = executor.train_step(x, y, LR)
    after = executor.state_dict()
    update = {k: after[k] - start[k] for k in executor.gradients()}
    return loss, executor.gradients(), update, logits


def test_the_padded_convolutions_are_planned_with_a_weight_copy_and_a_workspace(net):
    name, plan, _, _ = net
    padded = {p.name: p for p in plan.params if p.half_padded >= 0}
    assert sorted(padded) == sorted(NETS[name][1]), sorted(padded)
    workspaces = {o.tensor for graph in plan.graphs.values() for op in graph.ops for o in op.writes
                  if o.role is Role.X_PADDED}
    for weight, (channels, padded_channels, has_workspace) in NETS[name][1].items():
        spec = padded[weight]
        assert spec.shape[-1] == channels and plan.tensor(spec.half_padded).shape == spec.shape[:3] + (padded_channels,)
        ops = [op for graph in plan.graphs.values() for op in graph.ops
               if any(o.role is Role.WEIGHT and o.tensor == spec.tensor for o in op.reads)]
        written = {o.tensor for op in ops for o in op.writes if o.role is Role.X_PADDED}
        # train forward, train backward, eval forward: one workspace each, 16-byte rows of the padded channels
        assert len(written) == (3 if has_workspace else 0), (weight, written)
        assert all(plan.tensor(t).shape[-1] == padded_channels for t in written)
    assert ("input_unpadded" in plan.io) == (name == "interior")   # the stem reads the padded slot itself
    assert all(plan.tensor(t).region == "transient" for t in workspaces)


def test_the_step_runs_the_aligned_kernels_on_the_padded_input_and_matches_the_cpu_path(net):
    name, plan, cpu, cuda = net
    start = cpu.state_dict()
    x, y = _batch(1)
    loss, grads, update, logits = _step(cuda, start, x, y, poison=lambda: _poison_planned_memory(cuda, plan))
    want_loss, want_grads, want_update, want_logits = _step(cpu, start, x, y)
    tape = cuda._runners[("train", "train")].tape
    names = tape.names()
    assert not any("any_channels" in n for n in names), sorted(set(names))
    assert not any(n.startswith("conv2d_forward") for n in names), sorted(set(names))   # no SIMT forward
    forwards = [e for e in tape.kernels() if e.spec.name.startswith("mma_conv2d_forward")]
    dgrads = [e for e in tape.kernels() if e.spec.name.startswith("mma_conv2d_backward_data")]
    wgrads = [e for e in tape.kernels() if e.spec.name.startswith("mma_conv2d_backward_weight")]
    padded_x = {BATCH * HWC[0] * HWC[1] * channels * 2 for _, channels, _ in NETS[name][1].values()}
    # each padded convolution's forward and weight gradient read a padded input (the 8 -> 12 CBR reads 8 channels)
    assert sum(e.args[0].nbytes in padded_x for e in forwards) >= len(NETS[name][1]), [e.spec.name for e in forwards]
    assert sum(e.args[1].nbytes in padded_x for e in wgrads) >= len(NETS[name][1]) - (name == "shared")
    assert len(dgrads) >= 1 and names.count("channel_pad_backward") == 1   # the 12- / 3-channel input gradient
    np.testing.assert_allclose(loss, want_loss, rtol=1e-2)
    assert_close(grads, want_grads, GRAD_TOL, f"{name} gradient")
    assert_close(update, want_update, GRAD_TOL, f"{name} update")
    assert_close({"logits": logits}, {"logits": want_logits}, GRAD_TOL, f"{name} eval logits")
    # the user-visible weights, gradients and optimizer state keep the real channels; the padded copies' extra
    # columns are zero, their real ones the fp16 master
    state = cuda.state_dict()
    for weight, (channels, padded_channels, _) in NETS[name][1].items():
        spec = next(p for p in plan.params if p.name == weight)
        torch_shape = (spec.shape[0], channels) + spec.shape[1:3]   # PyTorch's OIHW
        assert state[weight].shape == grads[weight].shape == want_grads[weight].shape == torch_shape
        assert all(cuda._read(s).shape == spec.shape for s in spec.state)
        copy = cuda._download(cuda._persistent[spec.half_padded])
        master = cuda._download(cuda._persistent[spec.tensor])
        assert np.all(copy[..., channels:] == 0), f"{weight}: the padded copy's extra columns are not zero"
        assert np.array_equal(copy[..., :channels], master.astype(np.float16))


def test_a_checkpoint_round_trip_keeps_the_real_channels(net, tmp_path):
    """``state_dict`` -> ``load_state_dict`` on a fresh executor: the padded copies are rewritten from the loaded
    masters (their extra columns zero), and the eval logits agree."""
    name, plan, cpu, cuda = net
    x, _ = _batch(2)
    state = cuda.state_dict()
    fresh = CudaExecutor(plan, CrossEntropyLoss(), SGD().momentum(0.9).weight_decay(1e-3), seed=9,
                         init_loss_scale=CHECK_SCALE)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.forward(x), cuda.forward(x))
    for weight, (channels, _, _) in NETS[name][1].items():
        spec = next(p for p in plan.params if p.name == weight)
        assert fresh.state_dict()[weight].shape == (spec.shape[0], channels) + spec.shape[1:3]
        assert np.all(fresh._download(fresh._persistent[spec.half_padded])[..., channels:] == 0)
