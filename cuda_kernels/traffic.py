"""Bytes and launches of a recorded step, counted from each launch's arguments (no device).

Which array arguments a kernel reads and which it writes is read from its source (``access``): a
subscript load reads, a subscript store writes, an augmented store or a ``cuda.atomic`` call does both,
and an array passed to a device function is treated as that function treats its parameter (recursively).
An intrinsic is known by name: ``st_*`` (``st_global_v4``) writes its first argument, every other one
(``cp_async_16``, ``ld_global_v4``) reads its arrays. An access under ``if flag:`` with ``flag`` a scalar
parameter (``accumulate``) counts only at launches where that argument is nonzero.

A launch moves every byte of each array it touches, once (``launch_bytes``): the kernels are grid-stride
passes over whole views, so this is what an ideal kernel moves; a GEMM re-reads its operands from L2 and
its own model (``benchmarks.gpu.model``) counts that, which is why totals split GEMM from the rest.
"""
import ast
import inspect
import textwrap
from collections import defaultdict
from functools import lru_cache

import numpy as np

GEMM_PREFIX = "mma_"   # the tensor-core kernels (their own table, ``mma_kernels``)
#: kernel name -> ``rule(args) -> (bytes read, bytes written)``, for a kernel that touches part of an array
#: argument (``zero_ranges``: the ranges of the arena it zeroes); registered by the kernel's module.
BYTE_RULES = {}
DATA = "?"   # the guard of an access under a test of the data or the geometry (a bounds check, ``isinf``)


def _source_tree(func):
    return ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]


def _resolve(func, name):
    """The object ``name`` means inside ``func`` (closure first, then globals), or None."""
    try:
        scope = inspect.getclosurevars(func)
    except (TypeError, ValueError):
        return None
    for where in (scope.nonlocals, scope.globals, scope.builtins):
        if name in where:
            return where[name]
    return getattr(func, "__globals__", {}).get(name)


def _callee_name(node):
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


@lru_cache(maxsize=None)
def access(func):
    """``{parameter: {"r": guards, "w": guards}}`` of the Python function ``func`` (a kernel's or a device
    function's source): a guard is None (always), the name of the scalar parameter the access depends on, or
    ``DATA`` (a test of anything else: counted as if taken)."""
    tree = _source_tree(func)
    params = [a.arg for a in tree.args.args]
    found = defaultdict(lambda: {"r": set(), "w": set()})

    def note(name, mode, guards):
        if name in params:
            found[name][mode].add(guards[-1] if guards else None)

    def walk(node, guards):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id in params:
            walk(node.test, guards)
            for child in node.body:
                walk(child, guards + [node.test.id])
            for child in node.orelse:
                walk(child, guards)
            return
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and isinstance(_resolve(func, node.test.id), (bool, int)):   # a compile-time constant: pruned
            for child in node.body if _resolve(func, node.test.id) else node.orelse:
                walk(child, guards)
            return
        if isinstance(node, ast.If):   # any other test: the branches' accesses depend on the data ("?")
            walk(node.test, guards)
            for child in node.body + node.orelse:
                walk(child, guards + [DATA])
            return
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript) \
                and isinstance(node.target.value, ast.Name):
            note(node.target.value.id, "r", guards)
            note(node.target.value.id, "w", guards)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            note(node.value.id, "w" if isinstance(node.ctx, ast.Store) else "r", guards)
        elif isinstance(node, ast.Call):
            call(node, guards)
        for child in ast.iter_child_nodes(node):
            walk(child, guards)

    def call(node, guards):
        name = _callee_name(node.func)
        names = [a.id if isinstance(a, ast.Name) else None for a in node.args]
        for packed in (a for a in node.args if isinstance(a, ast.Tuple)):   # operands handed on in a tuple: read
            for element in packed.elts:
                if isinstance(element, ast.Name):
                    note(element.id, "r", guards)
        if isinstance(node.func, ast.Attribute) and _callee_name(node.func.value) == "atomic":
            if names and names[0]:
                note(names[0], "r", guards)
                note(names[0], "w", guards)
            return
        target = _resolve(func, name) if isinstance(node.func, ast.Name) else None
        inner = getattr(target, "py_func", None)
        if inner is not None:
            try:
                callee = access(inner)
                callee_params = [a.arg for a in _source_tree(inner).args.args]
            except (OSError, TypeError, SyntaxError):
                callee = None
            if callee is not None:
                for mine, theirs in zip(names, callee_params):
                    for mode, their_guards in callee.get(theirs, {}).items():
                        for g in their_guards:
                            # a callee's guard on its own parameter becomes the caller's argument there
                            mapped = names[callee_params.index(g)] if g in callee_params and \
                                callee_params.index(g) < len(names) else None
                            note(mine, mode, guards + ([mapped] if mapped else []))
                return
        if name.startswith("st_"):   # st_global_v4(array, index, ...): a store intrinsic
            if names and names[0]:
                note(names[0], "w", guards)
            return
        for arg in names:   # load intrinsics (cp_async_16, ld_global_v4), math on scalars
            if arg:
                note(arg, "r", guards)

    for statement in tree.body:
        walk(statement, [])
    return {name: {mode: frozenset(g) for mode, g in modes.items()} for name, modes in found.items()}


def _counts(guards, values):
    return any(g is None or g == DATA or (g in values and bool(values[g])) for g in guards)


def launch_bytes(spec, args):
    """``(bytes read, bytes written)`` of one launch of ``spec`` with ``args``: every byte of each array
    argument the kernel reads (writes) at this launch's scalar flags."""
    if spec.name in BYTE_RULES:
        return BYTE_RULES[spec.name](args)
    rules = access(spec.pyfunc)
    values = dict(zip(spec.argnames, args))
    read = written = 0
    for name, arg in values.items():
        if not hasattr(arg, "nbytes") or np.ndim(arg) == 0 and not hasattr(arg, "shape"):
            continue
        modes = rules.get(name, {})
        if _counts(modes.get("r", ()), values):
            read += int(arg.nbytes)
        if _counts(modes.get("w", ()), values):
            written += int(arg.nbytes)
    return read, written


def tape_traffic(launches):
    """``{kernel name: [launches, bytes read, bytes written]}`` of ``launches`` (objects with ``spec`` and
    ``args``: a tape's kernels)."""
    table = {}
    for launch in launches:
        read, written = launch_bytes(launch.spec, launch.args)
        row = table.setdefault(launch.spec.name, [0, 0, 0])
        row[0] += 1
        row[1] += read
        row[2] += written
    return table


def totals(table, gemm=False):
    """``(launches, bytes read, bytes written)`` over the GEMM (``gemm``) or the other kernels of ``table``."""
    rows = [row for name, row in table.items() if name.startswith(GEMM_PREFIX) == gemm]
    return tuple(sum(row[i] for row in rows) for i in range(3))


#: the tensor classes of ``step_floor``: a graph tensor's by its name (``planner.schedule``: ``train.v7`` a value,
#: ``train.d7`` its gradient, ``train.g7`` / ``train.r7`` a fused backward's internal gradient / recomputed value,
#: ``train.<layer>:<role>`` an extra: saved statistics or masks, or a workspace)
GRAPH_CLASSES = {"v": "values (conv outputs, activations)", "d": "value gradients",
                 "g": "fused-backward gradients", "r": "fused-backward recomputed values"}


def tensor_class(t):
    """The floor's class of plan tensor ``t``: its region if persistent, else by its name (``GRAPH_CLASSES``)."""
    if not t.graph:
        return str(t.region)
    name = t.name.split(".", 1)[1]
    if ":" in name:
        return "saved extras (BN statistics, masks)" if str(t.region) == "saved" else "workspaces"
    return GRAPH_CLASSES.get(name[:1], "other")


def step_floor(plan, touched=None, graph="train"):
    """``{class: bytes}``: every tensor ``graph``'s step touches (its own tensors, the batch and the persistent
    regions: parameters, fp16 weights, gradients, optimizer state, statistics), each once. ``touched``: the
    ``(arena offset, bytes)`` of every array argument of the recorded step's launches; a workspace no launch takes
    whole (the im2col room the planner keeps for the CPU path's convolutions, which no CUDA kernel takes; another
    tensor may reuse its offset) is left out."""
    floor = defaultdict(int)
    for t in plan.tensors:
        if t.graph in ("", graph):
            kind = tensor_class(t)
            if kind == "workspaces" and touched is not None and (t.offset, t.nbytes) not in touched:
                continue
            floor[kind] += int(t.nbytes)
    return dict(floor)


def touched_offsets(launches, base):
    """``(arena offset, bytes)`` of every array argument of ``launches`` (offsets from the start of the uint8
    arena ``base``)."""
    start = device_span(base)[0]
    return {(device_span(arg)[0] - start, int(arg.nbytes)) for launch in launches for arg in launch.args
            if getattr(arg, "ndim", 0) >= 1 and arg.nbytes}


def device_span(array):
    """``(first byte address, end)`` of a device array (simulator arrays: of the host array they wrap)."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        interface = array.__array_interface__
    start = interface["data"][0]
    return start, start + array.nbytes


_span = device_span


def overwritten_fills(launches, fills=("fill_zero_u32", "fill_zero_f16")):
    """``[(fill index, kernel name)]``: the zero-fills of ``launches`` (a tape's kernels, as recorded) whose bytes
    the next launch touching them takes as an argument it writes unconditionally and never reads: a fill that
    kernel makes redundant (issue 23: no separate zero-fill of a buffer a kernel then writes whole)."""
    found = []
    for i, fill in enumerate(launches):
        if fill.spec.name not in fills:
            continue
        start, end = _span(fill.args[0])
        for later in launches[i + 1:]:
            hits = [(name, arg) for name, arg in zip(later.spec.argnames, later.args)
                    if getattr(arg, "ndim", 0) >= 1 and arg.nbytes and _span(arg)[0] < end and start < _span(arg)[1]]
            if hits:
                rules = access(later.spec.pyfunc)
                values = dict(zip(later.spec.argnames, later.args))
                if all(_span(arg) == (start, end) and not _counts(rules.get(name, {}).get("r", ()), values)
                       and rules.get(name, {}).get("w") == frozenset([None]) for name, arg in hits):
                    found.append((i, later.spec.name))
                break
    return found
