"""The breakdown's timing (``protocol.timed_replay`` with ``spin.spin_before``): the spin kernel is enqueued
before the first event, so the host's enqueueing of the whole step happens while the GPU spins and the
events time the kernels; and the spin kernel compiles for sm_90 to a nanosleep loop (no GPU needed)."""
from types import SimpleNamespace

import pytest

pytest.importorskip("numba", reason="the spin kernel is a numba.cuda kernel")

from benchmarks.gpu import spin  # noqa: E402
from benchmarks.gpu.protocol import timed_replay  # noqa: E402


def test_the_spin_is_enqueued_before_the_first_event_and_lasts_twice_the_host_launch_cost():
    order = []

    class Event:
        def record(self, stream):
            order.append("event")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.5
    entries = [SimpleNamespace(kind="kernel", name=f"k{i}", run=lambda stream, i=i: order.append(f"k{i}"))
               for i in range(3)]
    timed = timed_replay(entries, "stream", Event, before=lambda stream: order.append("spin"))
    assert order == ["spin", "event", "k0", "event", "k1", "event", "k2", "event"]
    assert [t[1] for t in timed] == ["k0", "k1", "k2"]
    assert spin.spin_us(100) == 2 * spin.HOST_LAUNCH_US * 100


def test_the_spin_kernel_compiles_to_a_nanosleep_loop_for_sm_90():
    from types import SimpleNamespace as NS
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda, int32
    saved = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: NS(compute_capability=(9, 0))
    try:
        ptx, _ = cuda.compile_ptx(spin._spin.py_func, (int32,), cc=(9, 0))
    finally:
        dispatcher.get_current_device = saved
    assert "nanosleep" in ptx
