"""The transient-tensor offset allocator: the compiled build against its own source run uncompiled,
brute-force checks of every plan, hand-worked cases, input errors and plan quality."""
import bisect
import importlib
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import _build, memory_alloc

# The twins: `planner._memory` as imported (the compiled extension where it is built) and the same
# `_memory.py` loaded uncompiled under another module name (the oracle).
_memory = importlib.import_module("planner._memory")
_memory_py = _build.source("planner._memory")
_memory_c = _memory if _build.is_compiled(_memory) else None

NOT_BUILT = "planner._memory is not compiled; run `python setup.py build_ext --inplace` (or `pip install -e .`)"
needs_extension = pytest.mark.skipif(_memory_c is None, reason=NOT_BUILT)
IMPLEMENTATIONS = [
    pytest.param(_memory_py, id="pure"),
    pytest.param(_memory_c, id="cython", marks=needs_extension),
]
QUALITY_TARGET = 1.05  # project target: arena / lower bound on CNN-training-style schedules


@st.composite
def problems(draw, max_tensors=40, max_ops=30):
    n = draw(st.integers(0, max_tensors))
    sizes = draw(st.lists(st.one_of(st.just(0), st.integers(1, 5000), st.sampled_from([256, 512, 1024])),
                          min_size=n, max_size=n))
    first = draw(st.lists(st.integers(0, max_ops), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(0, max_ops // 2), min_size=n, max_size=n))
    alignment = draw(st.sampled_from([1, 8, 100, 256, 512]))
    return sizes, first, [f + d for f, d in zip(first, lengths)], alignment


def aligned_sizes(sizes, alignment):
    return [-(-s // alignment) * alignment for s in sizes]


def assert_valid_plan(sizes, first, last, alignment, offsets, arena):
    """Brute force: no two tensors live at the same op share a byte; all inside the arena."""
    size = aligned_sizes(sizes, alignment)
    assert offsets.dtype == np.int64 and offsets.shape == (len(sizes),)
    assert all(o % alignment == 0 and o >= 0 for o in offsets.tolist())
    assert arena == max([o + s for o, s in zip(offsets.tolist(), size) if s], default=0)
    for i in range(len(sizes)):
        if size[i] == 0:
            assert offsets[i] == 0
        for j in range(i):
            live_together = first[i] <= last[j] and first[j] <= last[i]
            if live_together and size[i] and size[j]:
                assert offsets[i] + size[i] <= offsets[j] or offsets[j] + size[j] <= offsets[i], (i, j)


def brute_force_lower_bound(sizes, first, last, alignment):
    size = aligned_sizes(sizes, alignment)
    ops = range(min(first, default=0), max(last, default=-1) + 1)
    return max((sum(s for s, f, l in zip(size, first, last) if f <= t <= l) for t in ops), default=0)


def plain_best_fit(sizes, first, last, alignment, strategy="size"):
    """The algorithm of `planner._memory` for one placement order, step by step, with no shelves or
    time buckets: every placed tensor is scanned for every new one. An independent check of the
    shelves and of the orders, which the compiled-vs-uncompiled twin tests cannot give (both run the
    same source)."""
    size = aligned_sizes(sizes, alignment)
    order = sorted(range(len(size)), key=PLAIN_ORDERS[strategy](size, first, last))
    offsets, placed = [0] * len(size), []  # placed: (offset, end, first, last), sorted by offset
    for i in order:
        if size[i] == 0:
            continue
        best_offset, best_gap, prev_end = -1, 0, 0
        for p_offset, p_end, p_first, p_last in placed:
            if p_first > last[i] or p_last < first[i]:
                continue
            gap = p_offset - prev_end
            if gap >= size[i] and (best_offset < 0 or gap < best_gap):
                best_offset, best_gap = prev_end, gap
            prev_end = max(prev_end, p_end)
        offsets[i] = prev_end if best_offset < 0 else best_offset
        bisect.insort(placed, (offsets[i], offsets[i] + size[i], first[i], last[i]))
    return offsets, max([o + s for o, s in zip(offsets, size) if s], default=0)


def brute_force_widest_live(size, first, last):
    """Per tensor, the most bytes live at any op of its lifetime, op by op."""
    live_at = {t: sum(s for s, f, l in zip(size, first, last) if f <= t <= l) for t in set(first)}
    return [max((b for t, b in live_at.items() if f <= t <= l), default=0) for f, l in zip(first, last)]


def _breadth_key(size, first, last):
    widest = brute_force_widest_live(size, first, last)
    return lambda i: (-widest[i], -size[i], first[i], i)


# Each strategy's order as a sort key, written out independently of `planner._memory`'s lexsorts.
PLAIN_ORDERS = {
    "size": lambda size, first, last: lambda i: (-size[i], first[i], i),
    "size_then_longest": lambda size, first, last: lambda i: (-size[i], first[i] - last[i], first[i], i),
    "size_then_latest": lambda size, first, last: lambda i: (-size[i], -last[i], i),
    "breadth": _breadth_key,
}


def plain_assign_offsets(sizes, first, last, alignment):
    """Greedy by size's plan where its arena is at most 1.05x the lower bound, else the smallest arena
    of the strategies in order (the first on a tie)."""
    plans = [plain_best_fit(sizes, first, last, alignment, strategy) for strategy in _memory_py.STRATEGIES]
    if 100 * plans[0][1] <= 105 * brute_force_lower_bound(sizes, first, last, alignment):  # integers: exact
        return plans[0]
    return min(plans, key=lambda plan: plan[1])


# -- every implementation on random problems ------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@settings(max_examples=150, deadline=None)
@given(problem=problems())
def test_plan_never_overlaps_live_tensors(impl, problem):
    sizes, first, last, alignment = problem
    offsets, arena = impl.assign_offsets(sizes, first, last, alignment)
    assert_valid_plan(sizes, first, last, alignment, offsets, arena)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@settings(max_examples=150, deadline=None)
@given(problem=problems())
def test_lower_bound_is_peak_live_bytes_and_bounds_the_arena(impl, problem):
    sizes, first, last, alignment = problem
    bound = impl.live_lower_bound(sizes, first, last, alignment)
    assert bound == brute_force_lower_bound(sizes, first, last, alignment)
    assert impl.assign_offsets(sizes, first, last, alignment)[1] >= bound


@needs_extension
@pytest.mark.parametrize("strategy", PLAIN_ORDERS)
@settings(max_examples=60, deadline=None)
@given(problem=problems(max_tensors=120, max_ops=60))
def test_compiled_and_uncompiled_give_identical_plans_for_each_strategy(strategy, problem):
    sizes, first, last, alignment = problem
    c_offsets, c_arena = _memory_c.assign_offsets_by(strategy, sizes, first, last, alignment)
    py_offsets, py_arena = _memory_py.assign_offsets_by(strategy, sizes, first, last, alignment)
    assert c_offsets.tolist() == py_offsets.tolist() and c_arena == py_arena


@needs_extension
@settings(max_examples=200, deadline=None)
@given(problem=problems(max_tensors=120, max_ops=60))
def test_compiled_and_uncompiled_give_identical_plans(problem):
    sizes, first, last, alignment = problem
    c_offsets, c_arena = _memory_c.assign_offsets(sizes, first, last, alignment)
    py_offsets, py_arena = _memory_py.assign_offsets(sizes, first, last, alignment)
    assert c_offsets.tolist() == py_offsets.tolist() and c_arena == py_arena
    assert _memory_c.live_lower_bound(sizes, first, last, alignment) == \
        _memory_py.live_lower_bound(sizes, first, last, alignment)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@settings(max_examples=150, deadline=None)
@given(problem=problems(max_tensors=120, max_ops=60))
def test_shelves_place_exactly_as_the_plain_algorithm(impl, problem):
    """The heuristics alone (``search_nodes=0``); the exact search is `test_memory_exact.py`'s."""
    sizes, first, last, alignment = problem
    offsets, arena = impl.assign_offsets(sizes, first, last, alignment, search_nodes=0)
    assert (offsets.tolist(), arena) == plain_assign_offsets(sizes, first, last, alignment)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("strategy", PLAIN_ORDERS)
@settings(max_examples=60, deadline=None)
@given(problem=problems(max_tensors=60, max_ops=40))
def test_each_strategy_places_exactly_as_the_plain_algorithm(impl, strategy, problem):
    sizes, first, last, alignment = problem
    offsets, arena = impl.assign_offsets_by(strategy, sizes, first, last, alignment)
    assert (offsets.tolist(), arena) == plain_best_fit(sizes, first, last, alignment, strategy)
    assert_valid_plan(sizes, first, last, alignment, offsets, arena)


def test_every_strategy_has_a_plain_twin():
    assert tuple(PLAIN_ORDERS) == _memory_py.STRATEGIES and _memory_py.STRATEGIES[0] == "size"


@pytest.mark.parametrize("strategy", PLAIN_ORDERS)
def test_shelves_place_exactly_as_the_plain_algorithm_on_a_large_problem(strategy):
    """Time buckets, tensors crossing them and pending merges, at a scale the random problems miss."""
    sizes, first, last = large_problem(seed=0, n=600)
    offsets, arena = _memory_py.assign_offsets_by(strategy, sizes, first, last)
    assert (offsets.tolist(), arena) == plain_best_fit(sizes.tolist(), first.tolist(), last.tolist(), 256, strategy)


@settings(max_examples=100, deadline=None)
@given(problem=problems())
def test_widest_live_is_the_most_bytes_live_at_any_op_of_the_lifetime(problem):
    sizes, first, last, alignment = problem
    aligned, first32, last32 = _memory_py.check_problem(sizes, first, last, alignment)
    widest = _memory_py._widest_live(aligned, first32, last32)
    assert widest.tolist() == brute_force_widest_live(aligned.tolist(), first, last)


def large_problem(seed, n=1500):
    rng = np.random.default_rng(seed)
    sizes = rng.choice([0, 1, 256, 4096, 65536, 1 << 20], size=n) * rng.integers(1, 4, size=n)
    first = rng.integers(0, 2000, size=n)
    last = first + np.where(rng.random(n) < 0.2, rng.integers(0, 2000, size=n), rng.integers(0, 4, size=n))
    return sizes, first, last


@needs_extension
@pytest.mark.parametrize("seed", range(4))
def test_compiled_and_uncompiled_agree_on_large_problems(seed):
    """Large enough to exercise the time buckets, crossing tensors and pending merges."""
    sizes, first, last = large_problem(seed)
    c_offsets, c_arena = _memory_c.assign_offsets(sizes, first, last)
    py_offsets, py_arena = _memory_py.assign_offsets(sizes, first, last)
    assert np.array_equal(c_offsets, py_offsets) and c_arena == py_arena
    assert _memory_c.live_lower_bound(sizes, first, last) == _memory_py.live_lower_bound(sizes, first, last)


# -- hand-worked cases ----------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_disjoint_lifetimes_share_offset_zero(impl):
    offsets, arena = impl.assign_offsets([1000, 256, 700], [0, 2, 4], [1, 3, 9])
    assert offsets.tolist() == [0, 0, 0] and arena == 1024


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_best_fit_takes_the_smallest_gap_not_the_first(impl):
    # Placed first, by size: x1 [0, 1024) and x3 [1792, 2304) die after op 2; x2 and x4 live on.
    sizes = [1024, 768, 512, 512, 512]
    first = [0, 0, 0, 0, 5]
    last = [2, 9, 2, 9, 9]
    offsets, arena = impl.assign_offsets(sizes, first, last)
    # The last tensor sees gaps [0, 1024) and [1792, 2304): best fit takes the exact one.
    assert offsets.tolist() == [0, 1024, 1792, 2304, 1792]
    assert arena == 2816 == impl.live_lower_bound(sizes, first, last)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_equal_gaps_go_to_the_lowest_offset(impl):
    # g1, g2 die after op 1 leaving two 1024-byte gaps between k1 and k2; y takes the lower,
    # then z fits exactly into what y left of it.
    sizes = [1024, 1024, 1024, 1024, 512, 512]  # g1 k1 g2 k2 y z
    first = [0, 0, 0, 0, 5, 5]
    last = [1, 9, 1, 9, 9, 9]
    offsets, arena = impl.assign_offsets(sizes, first, last)
    assert offsets.tolist() == [0, 1024, 2048, 3072, 0, 512]
    assert arena == 4096


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_chain_ending_beside_a_larger_workspace_reaches_the_bound(impl):
    # mobilenet_v3_small's miss in miniature: gradients a, b, c pass along a chain, each live for two
    # ops; the larger workspace w lives at the last op only. Greedy by size puts w at 0, then a at 0,
    # b at 512, and c, live with both w and b, on top: 1.2x the bound. Placed from the chain's end
    # (size_then_latest), c sits on w, b at 0 below c, a above b: exactly the bound.
    sizes, first, last = [512, 512, 512, 768], [0, 1, 2, 3], [1, 2, 3, 3]  # a b c w
    assert impl.live_lower_bound(sizes, first, last) == 1280
    by_size = impl.assign_offsets_by("size", sizes, first, last)
    assert (by_size[0].tolist(), by_size[1]) == ([0, 512, 1024, 0], 1536)
    by_latest = impl.assign_offsets_by("size_then_latest", sizes, first, last)
    assert (by_latest[0].tolist(), by_latest[1]) == ([512, 0, 768, 0], 1280)
    offsets, arena = impl.assign_offsets(sizes, first, last)
    assert (offsets.tolist(), arena) == ([512, 0, 768, 0], 1280)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_other_orders_run_only_above_the_target_and_the_first_smallest_wins(impl, monkeypatch):
    tried = []

    def counted(name, order):
        def run(*problem):
            tried.append(name)
            return order(*problem)
        return run

    for name, order in list(impl.ORDERS.items()):
        monkeypatch.setitem(impl.ORDERS, name, counted(name, order))
    chain = ([512, 512, 512, 768], [0, 1, 2, 3], [1, 2, 3, 3])  # the miniature above: 1.2x by size
    diluted = tuple(column + [value] for column, value in zip(chain, (6144, 0, 3)))  # + one tensor live throughout
    cases = [  # (problem, orders run, arena, lower bound)
        (([1000, 256, 700], [0, 2, 4], [1, 3, 9]), ["size"], 1024, 1024),  # greedy by size reaches the bound
        (chain, ["size", "size_then_longest", "size_then_latest"], 1280, 1280),  # stops at the bound
        (diluted, ["size"], 7680, 7424),  # 1.035x: within the target, greedy by size stands
        (SHORT_CHAIN, list(impl.STRATEGIES), 3072, 2048),  # none reaches the bound: all four run
    ]
    for (sizes, first, last), orders, arena, bound in cases:
        tried.clear()
        offsets, planned = impl.assign_offsets(sizes, first, last, search_nodes=0)  # the orders alone
        assert (tried, planned, impl.live_lower_bound(sizes, first, last)) == (orders, arena, bound)
        assert (offsets.tolist(), planned) == plain_assign_offsets(sizes, first, last, 256)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_lifetimes_are_inclusive(impl):
    # One dies at op 3, the next is born at op 3: they are live together and must not overlap.
    offsets, arena = impl.assign_offsets([256, 256], [0, 3], [3, 5])
    assert sorted(offsets.tolist()) == [0, 256] and arena == 512
    offsets, arena = impl.assign_offsets([256, 256], [0, 4], [3, 5])
    assert offsets.tolist() == [0, 0] and arena == 256


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_zero_size_tensors_are_never_planned(impl):
    offsets, arena = impl.assign_offsets([0, 300, 0], [0, 0, 0], [9, 9, 9])
    assert offsets.tolist() == [0, 0, 0] and arena == 512
    assert impl.live_lower_bound([0, 300, 0], [0, 0, 0], [9, 9, 9]) == 512


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_sizes_round_up_to_the_alignment(impl):
    offsets, arena = impl.assign_offsets([1, 1, 1], [0, 0, 0], [0, 0, 0])
    assert sorted(offsets.tolist()) == [0, 256, 512] and arena == 768
    offsets, arena = impl.assign_offsets([1, 1, 1], [0, 0, 0], [0, 0, 0], alignment=64)
    assert sorted(offsets.tolist()) == [0, 64, 128] and arena == 192


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_extreme_op_indices(impl):
    sizes = [256, 512, 256, 768, 256]
    first = [-2**31, -2**31, 0, 2**31 - 1, 5]
    last = [2**31 - 1, -2**31, 5, 2**31 - 1, 5]
    offsets, arena = impl.assign_offsets(sizes, first, last)
    assert_valid_plan(sizes, first, last, 256, offsets, arena)
    assert offsets.tolist() == [768, 0, 0, 0, 256] and arena == 1024
    assert impl.live_lower_bound(sizes, first, last) == 1024


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_empty_problem(impl):
    offsets, arena = impl.assign_offsets([], [], [])
    assert offsets.dtype == np.int64 and offsets.shape == (0,) and arena == 0
    assert impl.live_lower_bound([], [], []) == 0


# -- input validation -----------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("function", ["assign_offsets", "live_lower_bound"])
@pytest.mark.parametrize("sizes, first, last, kwargs, message", [
    ([256, 256], [0], [0, 1], {}, "equal lengths"),
    ([256], [3], [2], {}, "first <= last, but tensor 0 has first=3, last=2"),
    ([256, -1], [0, 0], [0, 0], {}, "non-negative, but tensor 1 has sizes=-1"),
    ([256.0], [0], [0], {}, "must hold integers"),
    ([[256]], [[0]], [[0]], {}, "one-dimensional"),
    ([256], [0], [2**31], {}, "fit in int32"),
    ([2**63 - 1], [0], [0], {}, "at most"),
    ([256], [0], [0], {"alignment": 0}, "alignment"),
    ([256], [0], [0], {"alignment": 2.5}, "alignment"),
    ([256], [0], [0], {"alignment": True}, "alignment"),
])
def test_invalid_problems_raise_clear_errors(impl, function, sizes, first, last, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        getattr(impl, function)(sizes, first, last, **kwargs)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@settings(max_examples=60, deadline=None)
@given(problem=problems())
def test_plan_offsets_is_assign_offsets_with_the_live_lower_bound(impl, problem):
    """What ``plan_memory`` calls: one placement and one bound sweep, the same as the two separate calls."""
    sizes, first, last, alignment = problem
    offsets, arena, bound = impl.plan_offsets(sizes, first, last, alignment)
    expected_offsets, expected_arena = impl.assign_offsets(sizes, first, last, alignment)
    assert offsets.tolist() == expected_offsets.tolist() and arena == expected_arena
    assert bound == impl.live_lower_bound(sizes, first, last, alignment)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_unknown_strategy_raises_a_clear_error(impl):
    with pytest.raises(ValueError, match="strategy must be one of size, size_then_longest, size_then_latest, "
                                         "breadth, got 'fastest'"):
        impl.assign_offsets_by("fastest", [256], [0], [0])


# -- the twins and choosing between them ------------------------------------------------------------

def test_the_oracle_is_the_source_uncompiled_never_the_extension():
    """The twin tests compare two different modules: were the oracle the module under test, they
    would pass vacuously."""
    assert _memory_py is not _memory and _memory_py.assign_offsets is not _memory.assign_offsets
    assert not _build.is_compiled(_memory_py) and _memory_py.__name__ == "planner._memory_source"
    assert Path(_memory_py.__file__) == Path(_build.__file__).with_name("_memory.py")


def test_pure_python_switch_selects_the_source_without_a_warning(monkeypatch):
    monkeypatch.setenv("BLUEPRINT_PURE_PYTHON", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _build.load("planner._memory") is _memory_py
        assert memory_alloc.assign_offsets([512, 256], [0, 0], [1, 1])[0].tolist() == [0, 512]
    monkeypatch.setattr(_memory_py, "assign_offsets", lambda *a: "the source ran")
    assert memory_alloc.assign_offsets([1], [0], [0]) == "the source ran"


@needs_extension
def test_default_is_the_cython_build(monkeypatch):
    monkeypatch.delenv("BLUEPRINT_PURE_PYTHON", raising=False)
    assert _build.load("planner._memory") is _memory_c
    monkeypatch.setattr(_memory_c, "live_lower_bound", lambda *a: "the extension ran")
    assert memory_alloc.live_lower_bound([1], [0], [0]) == "the extension ran"


# -- plan quality on CNN-training-style schedules -------------------------------------------------

def training_chain(activation_sizes, gradient_scale, workspace_sizes, residual_every):
    """Forward op t makes activation t, live until its backward op 2L-1-t; backward op b makes a
    gradient read by op b+1; optional one-op workspaces and residual tensors living 3 ops."""
    n_layers = len(activation_sizes)
    last_op = 2 * n_layers - 1
    tensors = []  # (size, first, last)
    for t, size in enumerate(activation_sizes):
        backward = last_op - t
        tensors.append((size, t, backward))
        tensors.append((int(size * gradient_scale[t]), backward, min(backward + 1, last_op)))
        if workspace_sizes:
            tensors.append((workspace_sizes[t], t, t))
            tensors.append((workspace_sizes[t], backward, backward))
        if residual_every and t % residual_every == 0:
            tensors.append((size, t, min(t + 3, last_op)))
    return tuple(list(column) for column in zip(*tensors))


@st.composite
def network_sized_chains(draw):
    """ResNet-scale chains: 4 stages whose activations halve in bytes, each size jittered."""
    n_layers = draw(st.integers(50, 120))
    jitter = st.floats(0.5, 1.5)
    stage_bytes = [8 << 20, 4 << 20, 2 << 20, 1 << 20]
    activations = [int(stage_bytes[4 * t // n_layers] * draw(jitter)) for t in range(n_layers)]
    gradient_scale = draw(st.lists(jitter, min_size=n_layers, max_size=n_layers))
    workspace = draw(st.one_of(st.just([]), st.lists(st.integers(1, 1 << 20), min_size=n_layers,
                                                       max_size=n_layers)))
    return training_chain(activations, gradient_scale, workspace, draw(st.sampled_from([0, 3])))


@settings(max_examples=25, deadline=None)
@given(chain=network_sized_chains())
def test_arena_within_target_of_lower_bound_on_network_sized_chains(chain):
    sizes, first, last = chain
    arena = _memory_py.assign_offsets(sizes, first, last)[1]
    assert arena <= QUALITY_TARGET * _memory_py.live_lower_bound(sizes, first, last)


SHORT_CHAIN = training_chain([256, 512, 768], [4.0, 1.5, 2 / 3], [], 0)
SHORT_CHAIN_OPTIMUM = [0, 256, 256, 1280, 1280, 768]


def test_short_chain_has_a_plan_at_the_lower_bound():
    sizes, first, last = SHORT_CHAIN
    assert (sizes, first, last) == ([256, 1024, 512, 768, 768, 512], [0, 5, 1, 4, 2, 3], [5, 5, 4, 5, 3, 4])
    bound = _memory_py.live_lower_bound(sizes, first, last)
    assert bound == 2048
    assert_valid_plan(sizes, first, last, 256, np.array(SHORT_CHAIN_OPTIMUM, dtype=np.int64), bound)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_short_chain_reaches_its_lower_bound(impl):
    # Every placement order needs 1.5x the bound here; the exact search finds a plan at the bound.
    sizes, first, last = SHORT_CHAIN
    assert impl.assign_offsets(sizes, first, last, search_nodes=0)[1] == 3072
    offsets, arena = impl.assign_offsets(sizes, first, last)
    assert arena == impl.live_lower_bound(sizes, first, last) == 2048
    assert_valid_plan(sizes, first, last, 256, offsets, arena)
