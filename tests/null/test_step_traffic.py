"""Bytes and launches of a recorded training step (issue 23, item 5), counted on host stand-ins: no GPU.

The per-launch byte rule (``cuda_kernels.traffic``) against counts made by hand, the floor against the plan's
parameter count, and the launches of ResNet-50 and ResNet-18-CIFAR at batch 256 after the tape merges
their zero-fills (``cuda_kernels.zero_ranges``). Issue 23's targets are 400 and 150 launches; the bounds
below are today's counts (386 and 150: no BN finalize launch, the apply and every other reader derive the
statistics from the saved sums; no ``accumulate_into`` copy in a residual add's backward, its inputs share
its output gradient; the loss-scale update and the counters in one ``finish_step``; one launch that pads the
uploaded 3-channel batch to the stem's 8 channels on the device), so a change that adds launches fails here.
"""
import numpy as np
import pytest

pytest.importorskip("numba", reason="the recorded step type-checks its launches against numba's types "
                                    "(pip install numba numba-cuda)")
from benchmarks.gpu.dry import step_traffic  # noqa: E402
from benchmarks.gpu.step_common import TIMING_MODELS  # noqa: E402
from cuda_kernels import optim, zero_ranges  # noqa: E402
from cuda_kernels.elementwise import ACTIVATION_KERNELS  # noqa: E402
from cuda_kernels.traffic import launch_bytes  # noqa: E402
from planner.ops import Prim  # noqa: E402

# model: (most launches, most zero-fill launches), measured by `python -m benchmarks.gpu.check --dry-run`
BOUNDS = {"resnet50": (386, 9), "resnet18-cifar": (150, 4)}
# kernels a fused ResNet step no longer launches (issue 23 item 5): folded into their readers or neighbours
FOLDED = ("batchnorm_finalize", "accumulate_into", "update_loss_scale", "advance_counters")


@pytest.fixture(scope="module", params=sorted(BOUNDS))
def traffic(request):
    model = next(m for m in TIMING_MODELS if m.name == request.param)
    return request.param, step_traffic(model)


def test_activation_backward_reads_dx_only_when_it_accumulates():
    spec = ACTIVATION_KERNELS[Prim.RELU].backward
    saved, dy, dx = (np.zeros(100, np.float16) for _ in range(3))
    f = np.float32(0)
    assert launch_bytes(spec, (saved, dy, dx, f, f, np.int32(0))) == (400, 200)   # saved + dy; dx
    assert launch_bytes(spec, (saved, dy, dx, f, f, np.int32(1))) == (600, 200)   # and dx, added to


def test_sgd_reads_gradients_and_updates_weights_and_momentum():
    n = 1000
    p, g, buf = (np.zeros(n, np.float32) for _ in range(3))
    one_f, one_i = np.zeros(1, np.float32), np.zeros(1, np.int32)
    args = (p, g, buf, one_f, one_i, one_f, one_i, np.float32(0.9), np.float32(0), np.int32(0), np.float32(0))
    assert launch_bytes(optim._sgd_step, args) == (3 * 4 * n + 4 * 4, 2 * 4 * n)   # p g buf + 4 scalars; p buf


def test_a_multi_range_fill_writes_its_ranges_only():
    words = np.zeros(1000, np.uint32)
    starts = (np.int64(0), np.int64(40)) + (np.int64(0),) * (zero_ranges.MAX_RANGES - 2)
    counts = (np.int64(5), np.int64(60)) + (np.int64(0),) * (zero_ranges.MAX_RANGES - 2)
    assert launch_bytes(zero_ranges._fill_zero_ranges, (words, starts, counts)) == (0, 4 * 65)


def test_the_floor_holds_every_parameter_once(traffic):
    _, (plan, _, _, _, floor, _, _, _) = traffic
    assert floor["params"] == floor["grads"] == floor["optim"] == 4 * plan.params_trainable   # fp32, SGD momentum
    padded = sum(plan.tensor(p.half_padded).nbytes for p in plan.params if p.half_padded >= 0)   # the stem's copy
    assert padded and floor["weights16"] == 2 * plan.params_trainable + padded
    # an AMP plan has no im2col workspace (the CPU path's room, no CUDA kernel's argument), nor does the floor
    assert not [t.name for t in plan.tensors if ":col_" in t.name] and "workspaces" not in floor
    values = [t for t in plan.tensors if t.graph == "train" and t.name.split(".", 1)[1].startswith("v")]
    assert floor["values (conv outputs, activations)"] == sum(t.nbytes for t in values)


def test_launches_per_step_and_zero_fills_merged(traffic):
    name, (_, names, table, recorded, _, overwritten, _, _) = traffic
    most, most_fills = BOUNDS[name]
    fills = [n for n in names if n.startswith("fill_zero")]
    assert len(names) <= most, f"{name}: {len(names)} launches per step (bound {most})"
    assert len(fills) <= most_fills, f"{name}: {len(fills)} zero-fill launches (bound {most_fills})"
    assert set(fills) == {"fill_zero_ranges"}, f"{name}: a one-range fill was not merged: {sorted(set(fills))}"
    assert recorded >= len(names)
    assert sum(row[0] for row in table.values()) == len(names)
    assert not overwritten, f"{name}: zero-fills of a buffer the next kernel writes whole: {overwritten}"
    unfolded = sorted({n for n in names if n.startswith(FOLDED)})
    assert not unfolded, f"{name}: launches of kernels folded into their neighbours: {unfolded}"


def test_no_convolution_of_the_zoo_resnets_runs_simt(traffic):
    """Issue 23, item 3: the 3-channel stem reads its input zero-padded to 8 channels with a weight copy padded to
    match, so it runs the aligned tensor-core kernels like every other layer. The dry run names the layers that
    launch a SIMT GEMM kernel: none but ResNet-18-CIFAR's 10-class classifier (the planner does not pad classes);
    the padded copy is written in the cast's one launch."""
    name, (plan, names, _, _, _, _, simt_gemms, _) = traffic
    simt_layers = {layer for layers in simt_gemms.values() for layer in layers}
    assert simt_layers == ({"fc"} if name == "resnet18-cifar" else set()), f"{name}: SIMT GEMMs at {simt_gemms}"
    assert names.count("cast_f32_to_f16_padded") == 1 and not any(n.startswith("cast_f32_to_f16_vec8")
                                                                for n in names), sorted(set(names))
    assert [p.name for p in plan.params if p.half_padded >= 0] == [plan.params[0].name]   # the stem's only
    stem = plan.arch.layers[0]
    assert stem.first and stem.in_channels == 3 and plan.arch.input_channels_padded == 8


def test_the_batch_is_uploaded_with_its_real_channels_and_padded_on_the_device(traffic):
    """The host uploads the 3-channel batch (fp16: 2 bytes a value), not the 8-channel slot the stem reads; the
    step's first kernel (after the merged zero-fills) writes the slot (8 channels) from it, in 16-byte stores, once
    per step."""
    name, (plan, names, table, _, _, _, _, uploads) = traffic
    shape = plan.variants["train"].input_shape   # (N, H, W, 3)
    assert shape[-1] == 3 and uploads["input"] == 2 * int(np.prod(shape)), (shape, uploads)
    first = [n for n in names if not n.startswith("fill_zero")][0]   # the merged zero-fills may move before it
    assert first == "channel_pad_forward_vec8" and names.count(first) == 1, names[:4]
    assert tuple(table[first]) == (1, 2 * int(np.prod(shape)), 2 * int(np.prod(shape)) // 3 * 8)


def test_a_fill_before_a_kernel_that_writes_the_buffer_whole_is_found():
    """``overwritten_fills``: a fill of ``y`` before ``y = relu(x)`` is redundant; a fill of the overflow flag
    before ``check_overflow`` (which writes it only where it finds an inf) is not."""
    from cuda_kernels.registry import all_kernels
    from cuda_kernels.tape import Launch
    from cuda_kernels.traffic import overwritten_fills
    x, y = np.ones(64, np.float16), np.ones(64, np.float16)
    g, flag = np.ones(16, np.float32), np.ones(1, np.int32)
    relu = ACTIVATION_KERNELS[Prim.RELU].forward
    f = np.float32(0)
    fill = all_kernels()
    launches = [Launch(fill["fill_zero_f16"], 1, 32, (y,)), Launch(relu, 1, 32, (x, y, f, f)),
                Launch(fill["fill_zero_u32"], 1, 32, (flag.view(np.uint32),)),
                Launch(optim._check_overflow, 1, 32, (g, flag))]
    assert overwritten_fills(launches) == [(0, "activation_forward.relu")]


def test_the_step_prediction_is_labelled_and_adds_the_tapes_bytes(capsys):
    """The dry run's step line: a PREDICTION, the assumed PyTorch figure named ASSUMED, and the other kernels'
    bytes entering at 4.3 TB/s (10 GB more: 2.33 ms more; printed to 0.1 ms)."""
    from benchmarks.gpu.dry import print_step_prediction
    model = next(m for m in TIMING_MODELS if m.name == "resnet18-cifar")
    print_step_prediction(model, 10e9, 100)
    print_step_prediction(model, 20e9, 100)
    lines = capsys.readouterr().out.splitlines()
    assert all("PREDICTED" in line and "ASSUMED" in line and "(predicted)" in line for line in lines)
    first, second = (float(line.split("other kernels' bytes at 4.3 TB/s ")[1].split()[0]) for line in lines)
    assert second - first == pytest.approx(10e9 / 4.3e12 * 1e3, abs=0.11)
