"""What PyTorch saves for backward in one training forward, next to the planner's number.

Every tensor autograd saves for backward goes through
`torch.autograd.graph.saved_tensors_hooks`; we record its storage, keeping unique storages
(keyed by `untyped_storage().data_ptr()`) and adding up their `nbytes()`.  Two totals:

  incl. params   every saved storage (activations, BN statistics, buffers, and the
                 parameters that ops such as conv / linear / BN save for backward)
  excl. params   leaving out storages that are a parameter's storage (these are
                 resident anyway, so they cost nothing extra for backward)

Models run fp32, channels_last (model and input `.to(memory_format=torch.channels_last)`),
in training mode, forward + cross-entropy loss (the planner's train graph has a loss head
too; the loss saves a few hundred KiB at most).

"Ours" is the planner's `plan.memory.saved_for_backward_bytes` for the blueprint zoo model
compiled for the same input (NHWC), unfused fp32 (`ArchPlan.from_blueprint(bp)`) and
fused AMP (`ArchPlan.from_blueprint(bp, fuse=True, amp=True)`).  The ratio is
ours / PyTorch (excl. params).

    python -m benchmarks.saved_bytes                          # resnet50, mobilenet_v2, resnet20
    python -m benchmarks.saved_bytes --models resnet20 --batch 64
    python -m benchmarks.saved_bytes --device cuda            # on a GPU (cuDNN saves differ)

Importable: `saved_bytes(model, x) -> dict`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

from tests.support import torch_models

MiB = 1 << 20

# name -> (torch constructor, default batch, image size, zoo name)
MODELS = {
    "resnet50": (torch_models.resnet50, 32, 224, "resnet50"),
    "mobilenet_v2": (torch_models.mobilenet_v2, 32, 224, "mobilenet_v2"),
    "resnet20": (torch_models.resnet20, 128, 32, "resnet20"),
    "resnet18": (torch_models.resnet18, 32, 224, "resnet18"),
    "resnet101": (torch_models.resnet101, 32, 224, "resnet101"),
}
DEFAULT_MODELS = ("resnet50", "mobilenet_v2", "resnet20")


def saved_bytes(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor | None = None,
                loss: bool = True) -> dict:
    """Run one forward of `model` on `x` (in whatever mode/format the caller set) under
    `saved_tensors_hooks` and report what autograd saved for backward.

    Returns a dict with
      incl_params / excl_params   bytes of unique saved storages, with / without parameter storages
      param_bytes                 bytes of the saved storages that are parameters'
      buffer_bytes                bytes of the saved storages that are buffers' (e.g. BN running stats)
      input_bytes                 bytes of `x`'s storage if it was saved (by the first conv), else 0
      n_storages / n_tensors      unique storages / saved tensors (all)
      tensor_bytes_excl_params    sum of saved tensors' own nbytes (not deduplicated, views count
                                  their view only), excluding parameters
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    buffer_ptrs = {b.untyped_storage().data_ptr() for b in model.buffers()}
    storages: dict[tuple, int] = {}
    n_tensors = 0
    tensor_bytes = 0

    def pack(t: torch.Tensor):
        nonlocal n_tensors, tensor_bytes
        n_tensors += 1
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in param_ptrs:
            tensor_bytes += t.numel() * t.element_size()
        if ptr != 0:  # zero-size storages (e.g. an empty reserve) share ptr 0 and hold nothing
            key = (str(t.device), ptr)
            storages[key] = max(storages.get(key, 0), st.nbytes())
        return t

    def unpack(t):
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = model(x)
        if loss:
            if target is None:
                target = torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
            out = F.cross_entropy(out, target)
    total = sum(storages.values())
    params = sum(n for (_, p), n in storages.items() if p in param_ptrs)
    buffers = sum(n for (_, p), n in storages.items() if p in buffer_ptrs and p not in param_ptrs)
    inputs = storages.get((str(x.device), x.untyped_storage().data_ptr()), 0)
    del out
    return {"incl_params": total, "excl_params": total - params, "param_bytes": params,
            "buffer_bytes": buffers, "input_bytes": inputs, "n_storages": len(storages), "n_tensors": n_tensors,
            "tensor_bytes_excl_params": tensor_bytes}


class _ReLU6SavesOutput(torch.autograd.Function):
    """In-place ReLU6 that saves its *output* for backward (mask 0 < y < 6)."""

    @staticmethod
    def forward(ctx, x):
        y = x.clamp_(0, 6)
        ctx.mark_dirty(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * ((y > 0) & (y < 6))


class ReLU6SavesOutput(torch.nn.Module):
    def forward(self, x):
        return _ReLU6SavesOutput.apply(x)


def swap_relu6(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every nn.ReLU6 with ReLU6SavesOutput (in place); returns the model."""
    for n, c in model.named_children():
        if isinstance(c, torch.nn.ReLU6):
            setattr(model, n, ReLU6SavesOutput())
        else:
            swap_relu6(c)
    return model


def torch_saved(name: str, batch: int, device: str = "cpu", relu6_saves_output: bool = False) -> dict:
    make, _, size, _ = MODELS[name]
    torch.manual_seed(0)
    model = make()
    if relu6_saves_output:
        swap_relu6(model)
    model = model.to(device).to(memory_format=torch.channels_last).train()
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    return saved_bytes(model, x)


def planner_saved(name: str, batch: int) -> tuple[int | None, int | None, str]:
    """(unfused fp32, fused AMP) saved-for-backward bytes from the planner, or None each."""
    _, _, size, zoo_name = MODELS[name]
    try:
        try:
            from planner import ArchPlan
        except ImportError:  # the Cython modules are not built
            os.environ["BLUEPRINT_PURE_PYTHON"] = "1"
            from planner import ArchPlan
        from blueprint import zoo
        from planner.compiler import Compiler
    except Exception as e:  # pragma: no cover - the planner is not importable
        return None, None, f"planner not importable: {e}"
    shape = {"train": (batch, size, size, 3)}
    out, notes = [], []
    for kw in ({}, {"fuse": True, "amp": True}):
        try:
            plan = Compiler(ArchPlan.from_blueprint(getattr(zoo, zoo_name)(), **kw)).compile(shape)
            out.append(plan.memory.saved_for_backward_bytes)
        except Exception as e:
            out.append(None)
            notes.append(f"{zoo_name} {kw or 'fp32'}: {type(e).__name__}: {e}")
    return out[0], out[1], "; ".join(notes)


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / MiB:,.1f}"


def _ratio(a, b) -> str:
    return "n/a" if a is None or not b else f"{a / b:.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=None, help="batch for every model (default: per model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-planner", action="store_true", help="skip the planner's numbers")
    ap.add_argument("--relu6-saves-output", action="store_true",
                    help="also run models with ReLU6 with a ReLU6 that saves its output instead of (a clone "
                         "of) its input, as PyTorch's hardtanh does; an extra row marked '*'")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    rows = []
    for name in args.models:
        batch = args.batch or MODELS[name][1]
        size = MODELS[name][2]
        t0 = time.perf_counter()
        r = torch_saved(name, batch, args.device)
        dt = time.perf_counter() - t0
        ours32, ours_amp, note = (None, None, "") if args.no_planner else planner_saved(name, batch)
        rows.append((name, batch, size, r, ours32, ours_amp, dt, note))
        if args.relu6_saves_output and name.startswith("mobilenet"):
            t0 = time.perf_counter()
            r = torch_saved(name, batch, args.device, relu6_saves_output=True)
            rows.append((name + "*", batch, size, r, ours32, ours_amp, time.perf_counter() - t0, ""))

    hdr = (f"{'model':14s} {'batch':>5s} {'size':>4s} {'torch incl':>11s} {'torch excl':>11s} "
           f"{'(params)':>9s} {'ours fp32':>10s} {'ratio':>6s} {'ours AMP+fuse':>13s} {'ratio':>6s} {'input':>6s} {'storages':>8s} {'s':>5s}")
    print(f"PyTorch {torch.__version__} saved-for-backward, one training forward + CE loss, fp32 channels_last, "
          f"device {args.device}; MiB (2^20 bytes); ratio = ours / torch excl. params")
    print(hdr)
    print("-" * len(hdr))
    for name, batch, size, r, o32, oamp, dt, _ in rows:
        print(f"{name:14s} {batch:5d} {size:4d} {_mib(r['incl_params']):>11s} {_mib(r['excl_params']):>11s} "
              f"{_mib(r['param_bytes']):>9s} {_mib(o32):>10s} {_ratio(o32, r['excl_params']):>6s} "
              f"{_mib(oamp):>13s} {_ratio(oamp, r['excl_params']):>6s} {_mib(r['input_bytes']):>6s} {r['n_storages']:8d} {dt:5.1f}")
    print("torch excl = unique saved storages minus parameter storages; (params) = saved parameter storages; "
          "input = the input batch, which torch's first conv saves (included in torch excl)")
    if any(r[0].endswith("*") for r in rows):
        print("* = with ReLU6SavesOutput: stock nn.ReLU6 (hardtanh) saves its input, an in-place one a clone "
              "of it, so every conv-bn-relu6 keeps two full-size tensors instead of one")
    for *_, note in rows:
        if note:
            print("note:", note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
