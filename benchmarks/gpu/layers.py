"""Measured against predicted, per layer: the convolution and linear launches of one recorded training
step, each timed by CUDA events around it (``protocol.timed_replay``), joined with
``model``'s PREDICTION for the same layer, pass and kernel family, so that the first GPU run
tells whether the model or the kernel is wrong (a ratio far from 1 on one pass of one shape points
at that kernel; on every row alike, at the model).

A launch is a GEMM launch when it takes the convolution geometry (``GEOMETRY_FIELDS``, its last argument or
the one before: every convolution, depthwise and linear kernel of both families takes one, a linear layer
as a 1x1 convolution over one-pixel images); its pass comes from the kernel's name, its family from the
``mma_`` prefix. Layers are told apart by shape and order: the i-th forward launch of a shape is
layer i of that shape and the backward launches of the shape are matched last-first (backward runs
the layers in reverse). Layers of one shape share one prediction, so a mismatch between two of them
would only move measured time between equal predictions. The zeroing launches before a fused
epilogue are not part of a layer's row (the per-kernel table counts them). Grouped convolutions
have no model (``predicted_ms`` None).
"""
from collections import defaultdict

from cuda_kernels.gemm import GEOMETRY_FIELDS

from .model import ConvShape, predict_conv

# kernel-name fragment -> pass of ``predict_conv``; the first that the name contains wins
PASSES = (("backward_data", "dgrad"), ("backward_weight", "wgrad"), ("forward", "forward"))


def gemm_pass(kernel_name):
    """The model's pass of a GEMM kernel's name; raises ``ValueError`` for a name none matches."""
    for fragment, kind in PASSES:
        if fragment in kernel_name:
            return kind
    raise ValueError(f"gemm_pass: kernel {kernel_name!r} takes a convolution geometry but its name contains none "
                     f"of {[f for f, _ in PASSES]}; add its pass to PASSES (benchmarks/gpu/layers.py)")


def launch_geometry(entry):
    """``{field: int}`` of a kernel entry that takes the convolution geometry, else None: its last argument, or
    the one before where the kernel adds its own constants after it (the weight gradient's pixel steps)."""
    args = getattr(entry, "args", ())
    if entry.kind != "kernel":
        return None
    for arg in args[-2:][::-1]:
        if isinstance(arg, tuple) and len(arg) == len(GEOMETRY_FIELDS):
            return dict(zip(GEOMETRY_FIELDS, (int(v) for v in arg)))
    return None


def _shape_key(g):
    return (g["batch"], g["h"], g["w"], g["c_in"], g["c_out"], g["kh"], g["kw"], g["stride"], g["pad"], g["groups"])


def _label(key, index):
    batch, h, w, c_in, c_out, kh, kw, s, p, groups = key
    if h == w == kh == kw == 1 and groups == 1:
        return f"linear {c_in}>{c_out} #{index}"
    kind = "dwconv" if groups > 1 else "conv"
    return f"{kind} {c_in}>{c_out} k{kh}s{s} {h}px #{index}"


def per_layer(entries, timed):
    """Rows ``{layer, pass, kernels, launches, measured_ms, predicted_ms, ratio, bound}`` in first-launch
    order, from the tape ``entries`` and ``timed`` (``[(kind, name, ms)]``, the same order)."""
    forwards, backwards = defaultdict(int), defaultdict(lambda: defaultdict(int))
    launches = []
    for entry, (_, name, ms) in zip(entries, timed):
        g = launch_geometry(entry)
        if g is None:
            continue
        key, kind = _shape_key(g), gemm_pass(name)
        if kind == "forward":
            index = forwards[key]
            forwards[key] += 1
        else:
            index = backwards[key][kind]
            backwards[key][kind] += 1
        launches.append((key, kind, index, name, ms))
    rows = {}
    for key, kind, index, name, ms in launches:
        if kind != "forward":   # the j-th backward launch of a shape belongs to its (count - 1 - j)-th layer
            index = max(forwards[key], backwards[key][kind]) - 1 - index
        row = rows.setdefault((key, index, kind), {"layer": _label(key, index), "pass": kind, "kernels": [],
                                                   "launches": 0, "measured_ms": 0.0})
        row["launches"] += 1
        row["measured_ms"] += ms
        if name not in row["kernels"]:
            row["kernels"].append(name)
    has_dgrad = {key for key, _, kind in rows if kind == "dgrad"}
    for (key, _, kind), row in rows.items():
        prediction = _predict(key, kind, row["kernels"], first=key not in has_dgrad)
        row["predicted_ms"] = prediction.seconds * 1e3 if prediction else None
        row["bound"] = prediction.bound if prediction else "no model"
        measured = row["measured_ms"] > 0   # stand-in events (the dry run) time nothing
        row["ratio"] = row["measured_ms"] / row["predicted_ms"] if row["predicted_ms"] and measured else None
    return list(rows.values())


def _predict(key, kind, kernels, first):
    """The model's prediction of one pass of one layer for the family its kernels belong to (None: no model)."""
    batch, h, w, c_in, c_out, kh, kw, s, p, groups = key
    if groups != 1 or h != w or kh != kw:
        return None
    mma, simt = predict_conv(ConvShape("", batch, h, c_in, c_out, kh, s, p, first)).get(kind, (None, None))
    return mma if all(k.startswith("mma_") for k in kernels) else simt


def format_layers(rows, label):
    lines = [f"  measured vs PREDICTED per layer ({label}; predictions: benchmarks/gpu/model.py):",
             f"  {'layer':30s} {'pass':7s} {'launches':>8s} {'measured ms':>11s} {'predicted ms':>12s} "
             f"{'ratio':>7s}  bound / kernels"]
    for r in rows:
        predicted = f"{r['predicted_ms']:12.4f}" if r["predicted_ms"] is not None else f"{'n/a':>12s}"
        ratio = f"{r['ratio']:7.2f}" if r["ratio"] is not None else f"{'n/a':>7s}"
        lines.append(f"  {r['layer'][:30]:30s} {r['pass']:7s} {r['launches']:8d} {r['measured_ms']:11.4f} {predicted} "
                     f"{ratio}  {r['bound']} / {', '.join(r['kernels'])}")
    measured = sum(r["measured_ms"] for r in rows)
    predicted = sum(r["predicted_ms"] or 0.0 for r in rows)
    lines.append(f"  {'total (GEMM layers)':30s} {'':7s} {sum(r['launches'] for r in rows):8d} {measured:11.4f} "
                 f"{predicted:12.4f} {measured / predicted if predicted and measured else float('nan'):7.2f}")
    return "\n".join(lines)
