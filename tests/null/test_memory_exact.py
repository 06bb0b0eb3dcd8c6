"""The offset allocator's exact search (step 5 of `planner._memory`): the optimum against a brute-force
oracle written here, valid plans, the compiled build against its source, and the placement budget."""
import functools
import importlib
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprint import zoo
from planner import ArchPlan, _build
from planner.compiler import Compiler
from tests.null.test_memory_alloc import SHORT_CHAIN, training_chain

_memory = importlib.import_module("planner._memory")
_memory_py = _build.source("planner._memory")
_memory_c = _memory if _build.is_compiled(_memory) else None
needs_extension = pytest.mark.skipif(_memory_c is None, reason="planner._memory is not compiled; run "
                                                               "`python setup.py build_ext --inplace`")
IMPLEMENTATIONS = [pytest.param(_memory_py, id="pure"), pytest.param(_memory_c, id="cython", marks=needs_extension)]
ALIGNMENT = 256
N_MISSED = 40  # random problems of 5-7 tensors where the four orders end above the lower bound
N_CHAINS = 200  # seeded short training chains, 2-8 layers
CHAINS_AT_THE_BOUND = {"heuristics": 153, "with the search": 198}  # of N_CHAINS, measured (the README quotes them)


def live_together(first, last, i, j):
    return first[i] <= last[j] and first[j] <= last[i]


def brute_force_optimum(sizes, first, last):
    """The smallest arena over every order of the tensors, each placed at the lowest offset where it fits.
    Exact: place an optimal plan's tensors in offset order and each lands at or below its offset there."""
    planned = [i for i, size in enumerate(sizes) if size]
    best = sum(sizes)
    for order in itertools.permutations(planned):
        placed, top = [], 0  # placed: (offset, end, tensor)
        for i in order:
            offset = 0
            for p_offset, p_end in sorted((o, e) for o, e, j in placed if live_together(first, last, i, j)):
                if p_offset >= offset + sizes[i]:
                    break
                offset = max(offset, p_end)
            placed.append((offset, offset + sizes[i], i))
            top = max(top, offset + sizes[i])
            if top >= best:
                break
        best = min(best, top)
    return best


def assert_valid(sizes, first, last, offsets, arena):
    offsets = offsets.tolist()
    assert all(offset % ALIGNMENT == 0 and offset >= 0 for offset in offsets)
    assert arena == max([o + s for o, s in zip(offsets, sizes) if s], default=0)
    for i, j in itertools.combinations(range(len(sizes)), 2):
        if sizes[i] and sizes[j] and live_together(first, last, i, j):
            assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i], (i, j)


@functools.lru_cache(maxsize=None)
def missed_problems():
    """Seeded random problems (sizes already aligned) on which the heuristics alone end above the bound."""
    rng, found = random.Random(0), []
    while len(found) < N_MISSED:
        n = rng.randint(5, 7)
        sizes = [ALIGNMENT * rng.randint(1, 6) for _ in range(n)]
        first = [rng.randint(0, 6) for _ in range(n)]
        last = [f + rng.randint(0, 3) for f in first]
        _, arena, bound = _memory_py.plan_offsets(sizes, first, last, ALIGNMENT, search_nodes=0)
        if arena > bound:
            found.append((sizes, first, last))
    return found


@functools.lru_cache(maxsize=None)
def optimum(case):
    return brute_force_optimum(*missed_problems()[case])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", range(N_MISSED))
def test_the_arena_is_the_brute_force_optimum(impl, case):
    sizes, first, last = missed_problems()[case]
    offsets, arena = impl.assign_offsets(sizes, first, last, ALIGNMENT)
    assert arena == optimum(case), (sizes, first, last)
    assert_valid(sizes, first, last, offsets, arena)


def test_the_oracle_table_holds_problems_the_heuristics_miss():
    """Without cases where the four orders end above the optimum, the test above would pass without the search."""
    heuristic = [_memory_py.assign_offsets(*missed_problems()[case], search_nodes=0)[1] for case in range(N_MISSED)]
    assert all(h > optimum(case) for case, h in enumerate(heuristic))


@functools.lru_cache(maxsize=None)
def short_chains():
    """Small networks' training steps (test_memory_alloc's `training_chain`): 2-8 layers, activations of
    1-8 aligned units, gradients 0.5-4x as large, one-op workspaces in half of them, residuals in half."""
    rng, chains = random.Random(1), []
    for _ in range(N_CHAINS):
        layers = rng.randint(2, 8)
        activations = [ALIGNMENT * rng.randint(1, 8) for _ in range(layers)]
        scale = [rng.choice([0.5, 2 / 3, 1, 1.5, 2, 4]) for _ in range(layers)]
        workspace = [ALIGNMENT * rng.randint(1, 8) for _ in range(layers)] if rng.random() < 0.5 else []
        sizes, first, last = training_chain(activations, scale, workspace, rng.choice([0, 3]))
        chains.append(([-(-size // ALIGNMENT) * ALIGNMENT for size in sizes], first, last))
    return chains


def test_short_training_chains_reach_their_bound_with_the_search():
    at_bound = {"heuristics": 0, "with the search": 0}
    for chain in short_chains():
        for name, budget in (("heuristics", 0), ("with the search", _memory.SEARCH_NODES)):
            offsets, arena, bound = _memory.plan_offsets(*chain, ALIGNMENT, search_nodes=budget)
            assert_valid(*chain, offsets, arena)
            at_bound[name] += arena == bound
    assert at_bound == CHAINS_AT_THE_BOUND


@st.composite
def small_problems(draw):
    n = draw(st.integers(1, 34))  # across EXACT_MAX_TENSORS
    aligned = st.integers(1, 8).map(lambda k: ALIGNMENT * k)
    sizes = draw(st.lists(st.one_of(st.just(0), aligned), min_size=n, max_size=n))
    first = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    return sizes, first, [f + d for f, d in zip(first, lengths)]


@needs_extension
@settings(max_examples=150, deadline=None)
@given(problem=small_problems(), budget=st.sampled_from([1, 7, 50, 10_000]))
def test_compiled_and_uncompiled_search_give_identical_plans(problem, budget):
    c_offsets, c_arena = _memory_c.assign_offsets(*problem, ALIGNMENT, search_nodes=budget)
    py_offsets, py_arena = _memory_py.assign_offsets(*problem, ALIGNMENT, search_nodes=budget)
    assert c_offsets.tolist() == py_offsets.tolist() and c_arena == py_arena


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@settings(max_examples=80, deadline=None)
@given(problem=small_problems(), budget=st.sampled_from([0, 1, 3, 20, 200]))
def test_any_budget_gives_a_valid_plan_between_the_heuristics_and_the_full_search(impl, problem, budget):
    offsets, arena = impl.assign_offsets(*problem, ALIGNMENT, search_nodes=budget)
    assert_valid(*problem, offsets, arena)
    heuristic = impl.assign_offsets(*problem, ALIGNMENT, search_nodes=0)
    assert impl.assign_offsets(*problem, ALIGNMENT)[1] <= arena <= heuristic[1]
    assert arena >= impl.live_lower_bound(*problem, ALIGNMENT)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("budget, arena", [(0, 3072), (1, 3072), (5, 3072), (10_000, 2048)])
def test_a_spent_budget_keeps_the_best_plan_found(impl, budget, arena):
    """SHORT_CHAIN's first leaf is six placements deep: fewer keep the heuristics' plan, unchanged."""
    heuristic = impl.assign_offsets(*SHORT_CHAIN, search_nodes=0)
    offsets, planned = impl.assign_offsets(*SHORT_CHAIN, search_nodes=budget)
    assert planned == arena
    assert_valid(*SHORT_CHAIN, offsets, planned)
    if planned == heuristic[1]:
        assert offsets.tolist() == heuristic[0].tolist()


def test_the_search_runs_only_above_the_bound_on_small_problems(monkeypatch):
    calls = []
    search = _memory_py._search_exact
    monkeypatch.setattr(_memory_py, "_search_exact", lambda *args: calls.append(len(args[0])) or search(*args))
    long_chain = tuple(column * 6 for column in SHORT_CHAIN)  # 36 tensors: SHORT_CHAIN six times over, live together
    cases = [  # (problem, searched)
        (SHORT_CHAIN, True),
        (([1000, 256, 700], [0, 2, 4], [1, 3, 9]), False),  # the heuristics reach the bound
        (long_chain, False),  # more than EXACT_MAX_TENSORS
    ]
    for problem, searched in cases:
        calls.clear()
        _memory_py.assign_offsets(*problem)
        assert bool(calls) == searched, problem
    assert len(long_chain[0]) > _memory_py.EXACT_MAX_TENSORS >= len(SHORT_CHAIN[0])


@pytest.mark.parametrize("model", ["mlp", "small_cnn", "resnet20"])
def test_zoo_plans_never_run_the_search(model, monkeypatch):
    """Every zoo plan reaches its lower bound with the heuristics: the search must not cost them anything."""
    monkeypatch.setenv("BLUEPRINT_PURE_PYTHON", "1")
    monkeypatch.setattr(_memory_py, "_search_exact", lambda *args: pytest.fail(f"{model} ran the exact search"))
    assert _build.load("planner._memory") is _memory_py
    entry = zoo.MODELS[model]
    arch = ArchPlan.from_blueprint(entry.build(), in_channels=entry.input_shape[2])
    Compiler(arch).compile({"train": (2, *entry.input_shape)}, training=True).verify()


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("budget", [-1, 2.5, True, None])
def test_a_bad_budget_raises_a_clear_error(impl, budget):
    with pytest.raises(ValueError, match=f"search_nodes must be a non-negative integer .*, got {budget!r}"):
        impl.assign_offsets(*SHORT_CHAIN, search_nodes=budget)
