"""Trees deeper than Python's recursion limit: `repr`, `==`, `hash`, `pretty`, `walk` and
`map_layers` are iterative, so a 10,000-deep chain (`net = seq(net, relu())` in a loop) works;
training such a net is in tests/cpu/test_deep_trees_train.py."""
import sys

import pytest

from blueprint import BluePrint, Kind, Layer, cbr, map_layers, relu, relu6, repeat, seq

DEPTH = 10_000
BASE = "cbr(4, 3, 1, 1)"


def chain(depth: int, activation=relu) -> Layer:
    net = cbr(4, 3, 1, 1)
    for _ in range(depth):
        net = seq(net, activation())
    return net


@pytest.fixture(scope="module")
def deep():
    assert DEPTH > 5 * sys.getrecursionlimit(), "the tree must be deeper than any recursion could go"
    return chain(DEPTH)


def test_repr_of_a_deep_tree_is_its_dsl_code(deep):
    assert repr(deep) == "seq(" * DEPTH + BASE + ", relu())" * DEPTH
    assert repr(BluePrint(deep)) == "BluePrint(" + repr(deep) + ")"


def test_equality_and_hash_of_deep_trees_are_structural(deep):
    twin = chain(DEPTH)
    assert twin is not deep and twin == deep and hash(twin) == hash(deep)
    assert BluePrint(twin) == BluePrint(deep) and hash(BluePrint(twin)) == hash(BluePrint(deep))
    different_bottom = cbr(8, 3, 1, 1)      # differs only at the deepest leaf
    for _ in range(DEPTH):
        different_bottom = seq(different_bottom, relu())
    assert different_bottom != deep and deep != different_bottom
    assert chain(DEPTH, relu6) != deep
    assert chain(DEPTH - 1) != deep
    assert len({deep, twin, different_bottom}) == 2


def test_shared_subtrees_compare_once():
    """Each level doubles the tree (2**60 leaves) but shares one child object: still compared in linear time."""
    a = b = relu()
    for _ in range(60):
        a, b = seq(a, a), seq(b, b)
    assert a == b and hash(a) == hash(b)
    c = relu6()
    for _ in range(60):
        c = seq(c, c)
    assert a != c


def test_pretty_prints_every_node_in_linear_size(deep):
    lines = deep.pretty().split("\n")
    assert len(lines) == 2 * DEPTH + 1
    assert lines[0] == "seq" and lines[-1].endswith("relu()")
    assert lines[DEPTH].endswith(f"[depth {DEPTH}] {BASE}")   # the deepest node: its depth as a number
    assert max(len(line) for line in lines) < 120          # indentation is capped, not quadratic


def test_walk_visits_every_node_parents_first(deep):
    visited = [(path, layer.kind) for path, layer in deep.walk()]
    assert len(visited) == 2 * DEPTH + 1
    assert visited[0] == ("seq", Kind.SEQ) and visited[1][1] is Kind.SEQ and visited[2][1] is Kind.SEQ
    deepest_path, deepest_kind = visited[DEPTH]
    assert deepest_kind is Kind.CBR and deepest_path == "seq" + "[0].seq" * (DEPTH - 1) + "[0].cbr"
    assert visited[-1] == ("seq[1].relu", Kind.RELU)
    assert sum(1 for _ in BluePrint(deep).walk()) == len(visited)


def test_map_layers_rebuilds_a_deep_tree(deep):
    swapped = map_layers(deep, lambda layer: relu6() if layer.kind is Kind.RELU else layer)
    assert swapped == chain(DEPTH, relu6)
    assert map_layers(deep, lambda layer: layer) is deep      # nothing changed: the same object back


def test_map_layers_keeps_shared_subtrees_shared():
    body = seq(relu(), relu())
    tree = seq(body, body, repeat(body, 3))
    calls = []
    mapped = map_layers(tree, lambda layer: calls.append(layer) or layer)
    assert mapped is tree and len(calls) == 5   # two relus, body (three parents), repeat, tree: once each
