"""Pinning BLAS to one thread is reference-counted across threads: two executors stepping in two
threads give bit-identical results to the same steps run alone, and the process-wide BLAS
thread count is what it was before, afterwards."""
import threading
import time

import numpy as np
import pytest

from blueprint import BluePrint, cbr, conv, fc, gap, seq
from blueprint.optim import SGD
from cpu_ref import CpuExecutor
from cpu_ref import _blas, _conv
from planner import ArchPlan
from planner.compiler import Compiler

pytestmark = pytest.mark.skipif(_blas.BLAS_THREADS is None,
                                reason="no thread control found for SciPy's OpenBLAS (nothing is pinned)")

STEPS = 6
BATCH, HWC = 8, (12, 12, 3)
NETS = {   # large enough that the convolutions' GEMMs take their partitioned, pinned path
    "a": BluePrint(seq(cbr(16, 3, 1, 1), conv(32, 3, 2, 1), cbr(32, 1, 1, 0), gap(), fc(10))),
    "b": BluePrint(seq(cbr(24, 3, 1, 1), cbr(24, 3, 1, 1), gap(), fc(10))),
}


def _executor(bp, seed):
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=HWC[2])).compile(
        {"train": (BATCH,) + HWC, "eval": (BATCH,) + HWC})
    return CpuExecutor(plan, optimizer=SGD().lr(0.05).momentum(0.9), seed=seed)


def _train(name, barrier=None):
    executor = _executor(NETS[name], seed=1)
    rng = np.random.default_rng(7)
    losses = []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH,) + HWC).astype(np.float32)
        y = rng.integers(0, 10, BATCH)
        if barrier is not None:
            barrier.wait()   # both threads step at the same time
        losses.append(executor.train_step(x, y, 0.05))
    return losses, executor.state_dict()


@pytest.fixture
def overlapping_pinned_sections(monkeypatch):
    """Each pinned GEMM section sleeps a millisecond before it ends (a sleep lets the other
    thread run), so that the two threads' sections overlap in every step rather than by luck."""
    run = _conv.run_partitioned

    def run_then_yield_the_gil(*args):
        run(*args)
        time.sleep(1e-3)
    monkeypatch.setattr(_conv, "run_partitioned", run_then_yield_the_gil)


def test_two_executors_in_two_threads_match_running_alone(overlapping_pinned_sections):
    before = _blas.blas_thread_count()
    alone = {name: _train(name) for name in NETS}
    assert _blas.blas_thread_count() == before
    together, errors = {}, []
    barrier = threading.Barrier(len(NETS))

    def run(name):
        try:
            together[name] = _train(name, barrier)
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(name,)) for name in NETS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert _blas.blas_thread_count() == before, "the process-wide BLAS thread count was not restored"
    for name in NETS:
        assert together[name][0] == alone[name][0], f"net {name}: losses differ when another thread trains"
        for key, value in alone[name][1].items():
            assert np.array_equal(together[name][1][key], value), f"net {name}: {key} differs"


def test_pinning_is_reference_counted_across_threads():
    """Thread A pins, B pins, A leaves: still pinned for B; B leaves: the count before comes back."""
    before = _blas.blas_thread_count()
    entered, release = threading.Event(), threading.Event()
    seen = {}

    def other():
        with _blas.one_blas_thread():
            entered.set()
            release.wait(10)
            seen["inside, after the first left"] = _blas.blas_thread_count()

    with _blas.one_blas_thread():
        assert _blas.blas_thread_count() == 1
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(10)
    seen["outside, while the other is inside"] = _blas.blas_thread_count()
    release.set()
    thread.join()
    assert seen == {"outside, while the other is inside": 1, "inside, after the first left": 1}
    assert _blas.blas_thread_count() == before
