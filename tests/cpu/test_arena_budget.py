"""Issue 24 item 9: an arena larger than the memory available is refused before it is allocated, with
its size, the amount available and the batch that would fit (tested with an injected "available")."""
import pytest

from blueprint import zoo
from planner import ArchPlan, arena_budget
from planner.arena_budget import ArenaTooLargeError, check_arena_fits
from planner.compiler import Compiler


@pytest.fixture(scope="module")
def plan():
    return Compiler(ArchPlan.from_blueprint(zoo.small_cnn(), in_channels=1)).compile({"train": (64, 8, 8, 1)})


def test_an_arena_that_fits_passes(plan):
    check_arena_fits(plan, plan.memory.arena_bytes, "host")
    check_arena_fits(plan, None, "host")          # unknown: not checked


def test_an_arena_over_the_available_memory_names_size_available_and_a_batch_that_fits(plan):
    need = plan.memory.arena_bytes
    with pytest.raises(ArenaTooLargeError) as info:
        check_arena_fits(plan, need // 2, "host")
    message = str(info.value)
    assert f"({need:,} bytes)" in message and f"({need // 2:,} bytes) available" in message
    fits = int(message.split("a batch of about ")[1].split()[0])
    assert 1 <= fits < 64
    smaller = Compiler(ArchPlan.from_blueprint(zoo.small_cnn(), in_channels=1)).compile({"train": (fits, 8, 8, 1)})
    check_arena_fits(smaller, need // 2, "host")   # the batch it names does fit


def test_the_cpu_executor_checks_before_allocating(plan, monkeypatch):
    from cpu_ref import CpuExecutor
    monkeypatch.setattr(arena_budget, "host_available_bytes", lambda: 1000)   # injected: nothing large is allocated
    with pytest.raises(ArenaTooLargeError, match=r"the host has 1000 B \(1,000 bytes\) available; not even a batch"):
        CpuExecutor(plan)


def test_host_available_memory_is_read():
    available = arena_budget.host_available_bytes()
    assert available is None or available > 0
