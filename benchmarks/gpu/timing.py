"""The step-timing section of the GPU check: images/s of one training step, ours (eager tape, CUDA
graph) against PyTorch eager AMP and torch.compile, as a side-by-side table, and the targets."""
import sys
import time

import numpy as np

from cuda_kernels.graph import synchronize

from .step_common import (COMPILE_RESERVE_S, MAX_TIMED_STEPS, MIB, MOMENTUM, SECTION_RESERVE_S, TIMED_S,
                               TIMING_LR, WARMUP_STEPS, compile_step_plan, release_device_memory, report_crash, sgd,
                               step_batches, train_runner)

TIMING_ROWS = (   # key, what the row measures
    ("ours eager", "ours: eager tape replay"),
    ("ours graph", "ours: CUDA graph replay"),
    ("ours train_step", "ours: graph, via train_step() *"),
    ("torch eager", "PyTorch eager AMP channels_last"),
    ("torch.compile", "torch.compile AMP channels_last"),
)


MIN_TIMED_STEPS = 3   # fewer only in the simulator tests (a stand-in step takes seconds there)


def measure_steps(step, sync, budget_s=None, warmup=None):
    """``(median seconds per step, steps timed)``: ``warmup`` untimed steps (default ``WARMUP_STEPS``), then
    up to three rounds of back-to-back steps (``budget_s`` in all, default ``TIMED_S``, at least
    ``MIN_TIMED_STEPS``), each timed from a synchronised device to ``sync()`` after its last step (the
    device's work is inside the timed region)."""
    budget_s = TIMED_S if budget_s is None else budget_s
    for _ in range(WARMUP_STEPS if warmup is None else warmup):
        step()
    sync()
    t = time.perf_counter()
    step()
    sync()
    one = max(time.perf_counter() - t, 1e-6)
    total = int(min(MAX_TIMED_STEPS, max(MIN_TIMED_STEPS, budget_s / one)))
    rounds = 3 if total >= 9 else 1
    per_round = total // rounds
    seconds = []
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        for _ in range(per_round):
            step()
        sync()
        seconds.append((time.perf_counter() - t) / per_round)
    return float(np.median(seconds)), per_round * rounds


def measure_ours(model, plan, x, y, mode):
    """Our training step on ``mode`` ("eager" / "graph") replay. The timed step is the recorded one
    replayed with the batch already in its arena slot (as PyTorch's timed step has its batch on the
    device); in graph mode also ``train_step()`` as a user calls it."""
    from cuda_kernels import CudaExecutor
    ex = CudaExecutor(plan, optimizer=sgd(), seed=0, replay=mode)
    t = time.perf_counter()
    ex.train_step(x, y, TIMING_LR)              # records the tape (and, in graph mode, captures after it)
    first_s = time.perf_counter() - t
    runner = train_runner(ex)
    if mode == "graph" and runner.graph is None:
        print(f"    ours graph: NO GRAPH, replay in use: {ex.replay_in_use}")
    seconds, steps = measure_steps(lambda: runner.run(ex.stream), lambda: synchronize(ex.stream))
    result = dict(seconds=seconds, steps=steps, launches=len(runner.tape), graph=runner.graph is not None,
                  first_step_s=first_s, replay=ex.replay_in_use)
    api = None
    if mode == "graph":
        api_s, api_steps = measure_steps(lambda: ex.train_step(x, y, TIMING_LR), lambda: synchronize(ex.stream),
                                      TIMED_S / 2, warmup=1)
        api = dict(seconds=api_s, steps=api_steps, launches=len(runner.tape), graph=True)
    result.update(final_loss=ex.train_step(x, y, TIMING_LR), loss_scale=ex.loss_scale)
    return result, api    # the executor goes with this frame; the caller releases its memory


def torch_cuda():
    """``torch`` if PyTorch can run on this GPU, else ``RuntimeError`` saying why not."""
    try:
        import torch
    except Exception as error:
        raise RuntimeError(f"PyTorch is not importable ({type(error).__name__}: {error}); install a CUDA build of "
                           f"torch") from error
    if not torch.cuda.is_available():
        raise RuntimeError(f"PyTorch {torch.__version__} sees no CUDA device (torch.version.cuda = "
                           f"{torch.version.cuda}; a CPU-only build?); install a CUDA build of the same version")
    return torch


def torch_inputs(model, device):
    """A fixed batch on ``device``: images NCHW in channels_last memory, int64 labels."""
    import torch
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(model.batch, 3, model.hw, model.hw, generator=generator)
    y = torch.randint(0, model.classes, (model.batch,), generator=generator)
    return x.to(device).contiguous(memory_format=torch.channels_last), y.to(device)


def make_torch_step(net, x, y, device, amp):
    """PyTorch's training step, as a user writes it: autocast fp16 forward and loss, GradScaler,
    SGD with momentum (foreach on CUDA). Returns ``step() -> loss`` (asynchronous but for the
    GradScaler's one inf check per step)."""
    import torch
    import torch.nn.functional as F
    optimizer = torch.optim.SGD(net.parameters(), lr=TIMING_LR, momentum=MOMENTUM)
    scaler = torch.amp.GradScaler(device, enabled=amp)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss
    return step


def measure_torch(model, compiled):
    """PyTorch's step on the GPU (eager, or ``torch.compile`` of the model in its default mode):
    timing, and ``max_memory_allocated`` of one steady-state step."""
    torch = torch_cuda()
    torch.backends.cudnn.benchmark = True     # fixed shapes: let cuDNN pick its fastest kernels (warm-up steps)
    net = model.make_torch().to(device="cuda", memory_format=torch.channels_last).train()
    if compiled:
        net = torch.compile(net)
    x, y = torch_inputs(model, "cuda")
    step = make_torch_step(net, x, y, "cuda", amp=True)
    t = time.perf_counter()
    step()                               # torch.compile compiles forward and backward here
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    seconds, steps = measure_steps(step, torch.cuda.synchronize)
    loss = float(step().detach())
    return dict(seconds=seconds, steps=steps, peak_bytes=peak, first_step_s=first_s, final_loss=loss)


def measure_torch_released(model, compiled):
    """``measure_torch``, then its model, optimizer and (compiled) graphs freed."""
    try:
        return measure_torch(model, compiled)
    finally:
        if compiled and "torch" in sys.modules:
            sys.modules["torch"]._dynamo.reset()
        release_device_memory()


def step_timing(models, budget, failures, skipped, notes, compile_torch=True):
    """The timing table: per model our eager and graph replays and PyTorch eager AMP, then (with
    the budget left, unless ``compile_torch`` is False) torch.compile, all in this process on this GPU."""
    rows = {}
    torch_why = ""
    try:
        torch = torch_cuda()
        print(f"  PyTorch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}) "
              f"on {torch.cuda.get_device_name()}")
    except RuntimeError as error:
        torch_why = str(error)
        print(f"  PyTorch columns NOT RUN: {torch_why}")
        skipped.append(f"step-timing PyTorch: {torch_why}")
    ordered = [m for m in models if not m.optional] + [m for m in models if m.optional]
    for model in ordered:
        need = 2 * SECTION_RESERVE_S if not model.optional else COMPILE_RESERVE_S
        if not budget.allows(need, f"step-timing {model.name}", skipped if not model.optional else notes):
            continue
        started = time.time()
        print(f"  {model.label}: {model.about}")
        row = rows[model.name] = {"model": model}
        try:
            plan = compile_step_plan(model)
            row["arena_bytes"] = plan.memory.arena_bytes
            (x, y), = step_batches(model, 1)
        except Exception as error:
            report_crash(f"step-timing {model.name}: plan", error, failures)
            plan = None
            for key in ("ours eager", "ours graph", "ours train_step"):
                row[key] = dict(error=f"no plan: {type(error).__name__}: {error}")
        for mode in ("eager", "graph") if plan is not None else ():
            try:
                result, api = measure_ours(model, plan, x, y, mode)
                release_device_memory()
                row[f"ours {mode}"] = result
                if api is not None:
                    row["ours train_step"] = api
                print(f"    ours {mode:5s}: {result['seconds'] * 1e3:8.2f} ms/step ({result['steps']} timed), first "
                      f"step {result['first_step_s']:.1f} s, loss scale now {result['loss_scale']:g}; replay in use: "
                      f"{result['replay']}")
                if mode == "graph" and not result["graph"]:
                    failures.append(f"step-timing {model.name}: graph replay asked for, {result['replay']}")
            except Exception as error:
                row[f"ours {mode}"] = dict(error=f"{type(error).__name__}: {error}")
                if mode == "graph":
                    row["ours train_step"] = dict(error="not measured: graph replay failed")
                report_crash(f"step-timing {model.name} ours {mode}", error, failures)
                release_device_memory()
        if torch_why:
            row["torch eager"] = dict(error=torch_why)
        else:
            try:
                row["torch eager"] = result = measure_torch_released(model, compiled=False)
                print(f"    torch eager: {result['seconds'] * 1e3:8.2f} ms/step ({result['steps']} timed), "
                      f"peak {result['peak_bytes'] / MIB:.0f} MiB")
            except Exception as error:
                row["torch eager"] = dict(error=f"{type(error).__name__}: {error}")
                report_crash(f"step-timing {model.name} torch eager", error, skipped)
                release_device_memory()
        print(f"    ({time.time() - started:.1f} s)")
    if compile_torch:
        torch_compile_column(rows, budget, notes, torch_why)
    print()
    print(format_timing_table(rows))
    return rows


def torch_compile_column(rows, budget, notes, torch_why=""):
    """torch.compile's column of ``rows`` (last: it may take minutes, and it only adds a column)."""
    for row in rows.values():
        model = row["model"]
        if torch_why:
            row["torch.compile"] = dict(error=torch_why)
            continue
        if budget.left() < COMPILE_RESERVE_S:
            why = f"not tried: {max(budget.left(), 0):.0f} s of the budget left, a compile needs ~{COMPILE_RESERVE_S} s"
            print(f"  torch.compile {model.name}: {why}")
            row["torch.compile"] = dict(error=why)
            notes.append(f"torch.compile {model.name}: {why}")
            continue
        try:
            row["torch.compile"] = result = measure_torch_released(model, compiled=True)
            print(f"  torch.compile {model.name}: {result['seconds'] * 1e3:8.2f} ms/step, compiled in "
                  f"{result['first_step_s']:.0f} s, peak {result['peak_bytes'] / MIB:.0f} MiB")
        except Exception as error:
            why = f"failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
            print(f"  torch.compile {model.name}: {why}")
            row["torch.compile"] = dict(error=why)
            notes.append(f"torch.compile {model.name}: {why}")
            release_device_memory()


def _images_per_s(model, result):
    if not result or "seconds" not in result:
        return None
    return model.batch / result["seconds"]


def format_timing_table(rows, dry=False):
    """The side-by-side table (text). ``rows``: model name -> {"model", "arena_bytes", row key -> result}."""
    head = (f"{'model':15s} {'batch':>5s} {'input':>9s}  {'measured':33s} {'ms/step':>8s} {'img/s':>8s} "
            f"{'vs eager':>8s} {'vs compile':>10s}  {'launches/step':22s} {'memory MiB':>14s}")
    lines = ["training step, images/s (higher is better); 'vs': our images/s / PyTorch's (> 1: ours is faster)",
             head, "-" * len(head)]
    for name, row in rows.items():
        model = row["model"]
        torch_eager = _images_per_s(model, row.get("torch eager"))
        torch_compiled = _images_per_s(model, row.get("torch.compile"))
        first = True
        for key, what in TIMING_ROWS:
            result = row.get(key)
            ident = (f"{name:15s} {model.batch:5d} {f'{model.hw}x{model.hw}':>9s}" if first
                     else f"{'':15s} {'':5s} {'':9s}")
            first = False
            if result is None or "seconds" not in result:
                why = "dry run: not timed" if dry else (result or {}).get("error", "not measured")
                if dry and key.startswith("ours") and "launches" in (result or {}):
                    why = f"dry run: not timed; {result['launches']} kernels recorded"
                lines.append(f"{ident}  {what:33s} {why[:120]}")
                continue
            ips = model.batch / result["seconds"]
            ours = key.startswith("ours")
            vs_eager = f"{ips / torch_eager:.2f}" if ours and torch_eager else "-"
            vs_compiled = f"{ips / torch_compiled:.2f}" if ours and torch_compiled else "-"
            if ours:
                launches = (f"1 graph ({result['launches']} k.)" if result.get("graph") and key != "ours eager"
                            else f"{result['launches']} kernels")
                memory = f"arena {row.get('arena_bytes', 0) / MIB:.1f}"
            else:
                launches, memory = "-", f"peak {result['peak_bytes'] / MIB:.1f}"
            lines.append(f"{ident}  {what:33s} {result['seconds'] * 1e3:8.2f} {ips:8.0f} {vs_eager:>8s} "
                         f"{vs_compiled:>10s}  {launches:22s} {memory:>14s}")
    lines.append("-" * len(head))
    lines.append("* train_step(): what a user calls: host fp32->fp16 cast of the batch into pinned staging, one sync "
                 "per step. The other 'ours' rows replay the recorded step as it stands: the upload of the staged "
                 "batch, the kernels, the download of loss and count, no host work and no sync between steps.")
    lines.append("PyTorch: torch.autocast(fp16) + GradScaler + SGD(momentum 0.9, foreach), channels_last model and "
                 "batch on the GPU, cudnn.benchmark on; torch.compile(model) in its default mode, same step around it.")
    lines.append("memory: ours = the whole arena (fp32 master weights, fp16 copies, gradients, momentum, "
                 "activations, workspaces, I/O); PyTorch = torch.cuda.max_memory_allocated() over one steady-state "
                 "step after reset_peak_memory_stats().")
    for name, row in rows.items():
        lines.append(f"{name}: {row['model'].about}; PyTorch model torch_models.{row['model'].torch_model}"
                     f"({row['model'].classes})")
    return "\n".join(lines)


def timing_targets(rows):
    """The issue's targets, as lines: one graph launch per step; resnet18-CIFAR >= PyTorch eager AMP."""
    lines = []
    graphs = {name: row.get("ours graph", {}).get("graph") for name, row in rows.items()}
    lines.append("target, one graph launch per training step: " + ", ".join(
        f"{name} {'not measured' if ok is None else 'met' if ok else 'NOT met'}" for name, ok in graphs.items()))
    row = rows.get("resnet18-cifar")
    if row:
        ours, theirs = (_images_per_s(row["model"], row.get(k)) for k in ("ours graph", "torch eager"))
        if ours and theirs:
            lines.append(f"target, resnet18-cifar at least as fast as PyTorch eager AMP: {ours:.0f} vs {theirs:.0f} "
                         f"img/s -> {'met' if ours >= theirs else 'NOT met'} ({ours / theirs:.2f}x)")
        else:
            lines.append("target, resnet18-cifar at least as fast as PyTorch eager AMP: not measured")
    return lines
