"""The preflight of a GPU run: each assumption only a real GPU can check, tried on its own in seconds, first.

A short-lived GPU session should learn at once *which* assumption failed, not find it later as a crash
in the middle of a training step. Each check below is tiny, runs in isolation (an exception is that
check's FAIL, with its type, message and traceback tail; the next check runs) and prints PASS, FAIL
or SKIP; together they are one record, unit "preflight". What each check assumes, and where that was
read in the installed packages: tests/cuda/test_gpu_assumptions.py (docs/gpu-runbook.md).

    stream         graph.new_stream(): a non-blocking cuda.core stream (all later checks run on it)
    handle         dynamic_smem.loaded_handle: numba-cuda's private accessor chain gives a CUkernel or
                   CUfunction and an int device ordinal for a compiled kernel
    shared-limit   cuKernelSetAttribute / cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) is accepted and
                   reads back (cuKernelGetAttribute / cuFuncGetAttribute) as the tile's byte count
    mma-forward    one tensor-core convolution (mma.sync, ldmatrix, cp.async; the tile the planner would
                   choose) on a tiny shape equals numpy
    mma-dynamic    the 128x128 input gradient (dynamic shared memory above 48 KB: the launch's 4th item and
                   the raised limit) on a tiny shape equals numpy
    graph          a tiny tape captured with a cuda.core GraphBuilder as the launch stream and replayed with
                   graph.launch(stream) equals eager replay, device step counter included
"""
import time
import traceback
from dataclasses import dataclass

import numpy as np
from numba import cuda

from cuda_kernels import dynamic_smem, graph
from cuda_kernels.registry import SIMULATOR

TRACEBACK_LINES = 12      # the tail of a failed check's traceback kept in its record
FP16_TOLERANCE = (2e-3, 1e-3)   # test_kernels.py's fp16 (rtol, atol as a fraction of the largest |expected|)


class PreflightSkip(Exception):
    """A check that cannot run here (the simulator has no handles or graphs); says why."""


@dataclass(frozen=True)
class Check:
    name: str
    assumption: str
    run: object        # run(stream) -> a one-line detail; raises on failure, PreflightSkip where it cannot run


def _wide_dgrad_spec():
    from cuda_kernels.mma_dgrad import DGRAD
    from cuda_kernels.mma_tiles import GPU_TILES
    spec = DGRAD[GPU_TILES[0]]
    if spec.dynamic_shared_bytes <= dynamic_smem.STATIC_SHARED_LIMIT:
        raise AssertionError(f"{spec.name}: expected a tile above 48 KB of shared memory, got "
                             f"{spec.dynamic_shared_bytes} dynamic bytes")
    return spec


def check_handle(stream):
    if SIMULATOR:
        raise PreflightSkip("the simulator has no loaded kernels (nothing to raise there)")
    from cuda.bindings import driver
    spec = _wide_dgrad_spec()
    handle, device = dynamic_smem.loaded_handle(spec)
    if not isinstance(handle, (driver.CUkernel, driver.CUfunction)) or not isinstance(device, int):
        raise TypeError(f"{spec.name}: expected (CUkernel or CUfunction, int device), got "
                        f"({type(handle).__name__}, {type(device).__name__}) from numba-cuda's "
                        f"compat.loaded_handle; fix cuda_kernels/compat.py")
    return f"{spec.name}: {type(handle).__name__} {int(handle):#x} on device {device}"


def read_max_dynamic_shared(handle, device):
    """The kernel's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` as the driver holds it."""
    from cuda.bindings import driver
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if isinstance(handle, driver.CUkernel):
        error, value = driver.cuKernelGetAttribute(attribute, handle, device)
    else:
        error, value = driver.cuFuncGetAttribute(attribute, handle)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"reading MAX_DYNAMIC_SHARED_SIZE_BYTES of {handle!r} failed with {error!r}")
    return int(value)


def device_optin_shared():
    """``(compute capability, the current device's opt-in shared memory per block in bytes)``."""
    device = cuda.get_current_device()
    return tuple(device.compute_capability), int(device.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)


def check_shared_limit(stream):
    if SIMULATOR:
        raise PreflightSkip("the simulator has no kernel attributes (its dynamic shared array is the launch's size)")
    spec = _wide_dgrad_spec()
    cc, optin = device_optin_shared()
    table = dynamic_smem.MAX_SHARED_PER_BLOCK.get(cc)
    if table is not None and optin < table:
        raise AssertionError(f"sm_{cc[0]}{cc[1]} opts in to {optin} shared bytes per block; "
                             f"dynamic_smem.MAX_SHARED_PER_BLOCK says {table}: correct the table")
    dynamic_smem.raise_shared_limit(spec)
    handle, device = dynamic_smem.loaded_handle(spec)
    value = read_max_dynamic_shared(handle, device)
    if value != spec.dynamic_shared_bytes:
        raise AssertionError(f"{spec.name}: MAX_DYNAMIC_SHARED_SIZE_BYTES reads {value} after raising it to "
                             f"{spec.dynamic_shared_bytes}")
    return (f"{spec.name}: MAX_DYNAMIC_SHARED_SIZE_BYTES = {value} (read back); sm_{cc[0]}{cc[1]} opts in to "
            f"{optin} bytes per block")


def _half(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def _close(label, got, expected):
    rtol, atol_fraction = FP16_TOLERANCE
    expected = np.asarray(expected, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=rtol,
                               atol=atol_fraction * float(np.abs(expected).max(initial=0.0)), err_msg=label)
    return float(np.abs(np.asarray(got, np.float64) - expected).max(initial=0.0))


def _replay(record, stream):
    """Record one launch on a tape, prepare it (compile, raise limits) and replay it on ``stream``."""
    from cuda_kernels.tape import LaunchTape
    tape = LaunchTape()
    record(tape)
    tape.compile_kernels()
    tape.replay(stream)
    graph.synchronize(stream)
    return tape


def check_mma_forward(stream):
    from cuda_kernels import mma_conv
    from planner import reference as ref
    rng = np.random.default_rng(21)
    x, w = _half(rng, (1, 5, 5, 8)), _half(rng, (12, 3, 3, 8), 0.5)   # M 25, N 12, K 72: every tile edge partial
    expected = ref.conv2d_forward(x.astype(np.float64), w.astype(np.float64), 1, 1, 1)
    dx, dw = cuda.to_device(x), cuda.to_device(w)
    y = cuda.to_device(np.full(expected.shape, np.nan, np.float16))
    cuda.synchronize()   # the legacy-stream copies finish before the non-blocking stream's launch
    tape = _replay(lambda t: mma_conv.conv2d_forward(t, dx, dw, y, 1, 1, 1), stream)
    error = _close("mma forward y", y.copy_to_host(), expected)
    return f"{tape.names()[0]} on (1, 5, 5, 8) * (12, 3, 3, 8): max |error| {error:.2e}"


def check_mma_dynamic(stream):
    from cuda_kernels import mma_dgrad
    from cuda_kernels.mma_tiles import GPU_TILES
    from planner import reference as ref
    spec = _wide_dgrad_spec()
    rng = np.random.default_rng(22)
    x, w = _half(rng, (1, 4, 4, 8)), _half(rng, (8, 1, 1, 8), 0.5)    # one block, one k-tile: quick in the simulator
    dy = _half(rng, ref.conv2d_forward(x.astype(np.float64), w.astype(np.float64), 1, 0, 1).shape)
    expected, _ = ref.conv2d_backward(x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64), 1, 0, 1)
    dw, ddy = cuda.to_device(w), cuda.to_device(dy)
    dx = cuda.to_device(np.full(x.shape, np.nan, np.float16))
    cuda.synchronize()
    _replay(lambda t: mma_dgrad.conv2d_backward_data(t, dw, ddy, dx, 1, 0, False, tile=GPU_TILES[0]), stream)
    error = _close("mma dgrad dx", dx.copy_to_host(), expected)
    return f"{spec.name} ({spec.dynamic_shared_bytes} dynamic shared bytes): max |error| {error:.2e}"


def _tiny_step():
    """A few launches driven by device counters (dropout draws per iteration): frozen arguments, moving state."""
    from cuda_kernels import elementwise, optim
    from planner.ops import Prim
    rng = np.random.default_rng(23)
    x = cuda.to_device(rng.standard_normal(256).astype(np.float16))
    y, mask = cuda.to_device(np.zeros(256, np.float16)), cuda.to_device(np.zeros(256, np.uint8))
    flag, step, iteration = (cuda.to_device(np.zeros(1, np.int32)) for _ in range(3))

    def record(tape):
        for _ in range(3):
            elementwise.dropout_forward(tape, x, y, mask, 0.5, 5, iteration)
            elementwise.activation_forward(tape, Prim.SILU, y, y)
        optim.advance_counters(tape, flag, step, iteration)
    return record, {"y": y, "mask": mask, "step": step}


def check_graph(stream):
    from cuda_kernels.tape import LaunchTape
    available, why = graph.graph_support()
    if not available:
        if SIMULATOR:
            raise PreflightSkip(why)
        raise RuntimeError(f"graph capture unavailable on this GPU: {why}")
    (record_e, eager), (record_g, graphed) = _tiny_step(), _tiny_step()
    tape_e, tape_g = LaunchTape(), LaunchTape()
    record_e(tape_e)
    record_g(tape_g)
    cuda.synchronize()
    tape_e.replay(stream)
    tape_g.replay(stream)          # the warm-up: every kernel compiled and loaded before the capture
    graph.synchronize(stream)
    captured = graph.capture_graph(tape_g.kernels())
    for _ in range(2):
        tape_e.replay(stream)
        captured.launch(stream)
    graph.synchronize(stream)
    differ = [label for label in eager
              if not np.array_equal(eager[label].copy_to_host(), graphed[label].copy_to_host())]
    if differ:
        raise AssertionError(f"graph replay differs from eager replay in {differ}")
    if int(graphed["step"].copy_to_host()[0]) != 3:
        raise AssertionError(f"the device step counter reads {graphed['step'].copy_to_host()[0]} after 1 eager step "
                             f"and 2 graph launches, expected 3")
    return f"{len(tape_g)} launches captured; 2 graph launches equal eager replay"


CHECKS = (
    Check("handle", "numba-cuda 0.30: compat.loaded_handle(kernel.compile(sig)) -> (CUkernel, device id)",
          check_handle),
    Check("shared-limit", "cuda.bindings 13: cuKernelSetAttribute(attrib, val, kernel, dev) sets "
                          "MAX_DYNAMIC_SHARED_SIZE_BYTES", check_shared_limit),
    Check("mma-forward", "inline-PTX mma.sync / ldmatrix / cp.async kernels run and equal numpy", check_mma_forward),
    Check("mma-dynamic", "a launch's 4th item is its dynamic shared bytes; the raised limit admits it",
          check_mma_dynamic),
    Check("graph", "cuda.core 1.2: a GraphBuilder is a numba launch stream; capture, complete, launch(stream)",
          check_graph),
)


def run_check(check, stream):
    """``{name, assumption, status: PASS | FAIL | SKIP, seconds, detail | error + traceback}``; never raises
    an ``Exception``."""
    started = time.perf_counter()
    result = {"name": check.name, "assumption": check.assumption}
    try:
        result.update(status="PASS", detail=check.run(stream))
    except PreflightSkip as why:
        result.update(status="SKIP", detail=str(why))
    except Exception as error:
        tail = traceback.format_exception(type(error), error, error.__traceback__)
        result.update(status="FAIL", error=f"{type(error).__name__}: {error}",
                      traceback="".join(tail).splitlines()[-TRACEBACK_LINES:])
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


def stream_check(made):
    """The first check: the run's stream (``graph.new_stream``), kept in ``made["stream"]``."""
    def make(_):
        stream = made["stream"] = graph.new_stream()
        if not SIMULATOR and not stream.is_nonblocking:
            raise AssertionError(f"{stream!r} is a blocking stream: graph capture needs a non-blocking one")
        return f"{type(stream).__module__}.{type(stream).__name__}" + ("" if SIMULATOR else " (non-blocking)")
    return Check("stream", "cuda.core 1.2: Device().set_current(); Device().create_stream() is non-blocking", make)


def preflight(out, failures, checks=CHECKS):
    """Make a stream, run every check on it (on the legacy default stream if none could be made), print each
    verdict, write one "preflight" record; a FAIL is a failure of the run (named in ``failures``), and the run
    goes on with its sections. Returns the checks' results."""
    from .protocol import Unit
    with Unit(out, "preflight", failures) as unit:
        made, results = {}, []
        for check in (stream_check(made),) + tuple(checks):
            result = run_check(check, made.get("stream", 0))
            results.append(result)
            print(f"  {result['status']} {check.name} ({result['seconds']:.1f} s): "
                  f"{result.get('detail') or result.get('error')}", flush=True)
            if result["status"] == "FAIL":
                print("    " + "\n    ".join(result["traceback"]), flush=True)
                failures.append(f"preflight {check.name}: {result['error'].splitlines()[0]}")
        unit.fields["checks"] = results
        unit.status = "failed" if any(r["status"] == "FAIL" for r in results) else "ok"
    return results
