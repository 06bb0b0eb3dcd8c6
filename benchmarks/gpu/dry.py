"""The ``--dry-run`` of the GPU check, no device needed: every kernel row built on host stand-ins
with its launches type-checked against the kernel table; the step sections' plans compiled and
each training step recorded by ``CudaExecutor``'s own code, its device-only pieces stood in for;
the PyTorch twins of the timed models checked against those plans."""
import math
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np

from cuda_kernels.graph import graph_support
from cuda_kernels.mma_kernels import all_mma_kernels
from cuda_kernels.registry import all_kernels
from cuda_kernels.tape import Launch
from cuda_kernels.zero_ranges import coalesce_zero_fills

from .kernel_cases import CHECK_BATCH, TIMING_BATCH, DryLauncher, HostStandIns, table
from .kernels import graph_case
from .step_common import MIB, StepModel, compile_step_plan, relative_errors, sgd, step_selection, torch_models
from .timing import format_timing_table, make_torch_step, torch_inputs


def host_arena_class():
    """``DeviceArena`` over host memory: an address-space reservation that is never touched (the dry
    run makes the executor's views and type-checks its launches; nothing is computed)."""
    import mmap
    from cuda_kernels.arena import ALIGNMENT, DeviceArena

    class HostArena(DeviceArena):
        def __init__(self, nbytes):
            self.nbytes = -(-int(nbytes) // ALIGNMENT) * ALIGNMENT
            try:   # MAP_NORESERVE: no commit charge for the gigabytes a big plan reserves
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
                self.buffer = np.frombuffer(mmap.mmap(-1, self.nbytes, flags=flags), np.uint8)
            except (AttributeError, OSError, ValueError):
                self.buffer = np.empty(self.nbytes, np.uint8)

        def zero(self, launcher=None):
            pass
    return HostArena


class _DryLaunch(Launch):
    """A recorded launch that runs nothing (its arguments are host stand-ins)."""

    def run(self, stream):
        pass


class _TapeStandIn(DryLauncher):
    """In ``LaunchTape``'s place: type-checks each launch (host stand-ins allowed) and keeps its name,
    and keeps the step's transfers (uploads, downloads, events) in order with the launches."""

    def __init__(self):
        super().__init__()
        self.order, self.entries = [], []
        self.recorded = 0   # kernel launches as recorded, before the zero-fills are merged
        self.layer = ""      # the layer whose op is being recorded (set by dry_record_train_step)
        self.launch_layers = []   # (kernel name, layer) of every launch, as recorded

    def launch(self, spec, grid, block, *args):
        super().launch(spec, grid, block, *args)
        self.order.append(("kernel", spec.name))
        self.launch_layers.append((spec.name, self.layer))
        self.entries.append(_DryLaunch(spec, grid, block, args))

    def add(self, entry):
        self.order.append((entry.kind, entry.name))
        nbytes = int(entry.slot.view.nbytes) if entry.kind in ("upload", "download") else 0   # the copy's bytes
        self.entries.append(SimpleNamespace(kind=entry.kind, name=entry.name, args=(), nbytes=nbytes,
                                            run=lambda stream: None))

    def coalesce_zero_fills(self, base):
        """``LaunchTape.coalesce_zero_fills`` on the recorded entries (the same pass)."""
        self.recorded = len(self.names)
        self.arena_buffer = base
        self.recorded_kernels = [e for e in self.entries if e.kind == "kernel"]
        self.entries = coalesce_zero_fills(self.entries, base, _DryLaunch)
        self.order = [(e.kind, e.name) for e in self.entries]
        self.names = [e.name for e in self.entries if e.kind == "kernel"]

    def __len__(self):
        return len(self.names)


class EventStandIn:
    """In a CUDA event's place (the dry run has no device)."""

    def record(self, stream):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.0


class _RunnerStandIn:
    """In ``StepRunner``'s place: keeps the recorded tape."""

    def __init__(self, tape, mode="eager", allow_eager_fallback=False):
        self.tape, self.mode, self.graph, self.reason = tape, mode, None, ""


@contextmanager
def _patched(module, **names):
    """``module``'s globals ``names`` replaced for the duration; a missing one is an error."""
    missing = sorted(n for n in names if not hasattr(module, n))
    if missing:
        raise RuntimeError(f"dry run: {module.__name__} no longer has {missing}; update "
                           f"dry_record_train_step (benchmarks/gpu/dry.py) to the executor's new structure")
    saved = {n: getattr(module, n) for n in names}
    for n, value in names.items():
        setattr(module, n, value)
    try:
        yield
    finally:
        for n, value in saved.items():
            setattr(module, n, value)


def dry_record_train_step(plan, optimizer, tape_class=None):
    """``(kernel names, classes, [(kind, name)] of every tape entry, the entries)`` of ``plan``'s training
    step (each entry has ``kind``, ``name``, the launch's ``args`` and a ``run`` that does nothing),
    recorded by ``CudaExecutor``'s own code (its constructor's views over a host arena, its
    ``_runner``) with the device-only pieces stood in for: no arena on a device, no initial weights
    written, a launcher that type-checks every launch against the kernel table instead of recording
    it for a device, host arrays and no-op events in place of pinned staging and CUDA events."""
    import cuda_kernels.executor as executor_module
    import cuda_kernels.transfer as transfer_module

    class DryExecutor(executor_module.CudaExecutor):
        def _upload_scalar(self, name, value):
            pass

        def _refresh_half_weights(self):
            self._half_dirty = False

    def record_op(tape, ctx, op, record=executor_module.record_op):
        """The executor's ``record_op``, telling the tape which layer it records."""
        layers = plan.arch.layers
        layer = layers[op.layer] if 0 <= op.layer < len(layers) else None
        # a fused layer by its convolution's parameter prefix (``conv1``), else by its name
        tape.layer = "" if layer is None else next((sub.prefix for sub in layer.sub if sub.kind == "conv"), layer.name)
        return record(tape, ctx, op)

    with _patched(executor_module, cuda_unavailable_reason=lambda: "", DeviceArena=host_arena_class(),
                  record_op=record_op,
                  new_stream=lambda: None, initial_parameters=lambda plan, seed: {}, LaunchTape=tape_class or _TapeStandIn,
                  StepRunner=_RunnerStandIn), \
            _patched(transfer_module, pinned_empty=np.empty, new_event=EventStandIn):
        ex = DryExecutor(plan, optimizer=optimizer, seed=0, replay="eager")
        runner = ex._runner(ex._variant_for(plan.variants["train"].input_shape, "train"), "train")
    order = runner.tape.order
    kinds = [kind for kind, _ in order]
    first, last = kinds.index("kernel"), len(kinds) - 1 - kinds[::-1].index("kernel")
    assert set(kinds[:first]) == {"upload", "event"} and set(kinds[last + 1:]) == {"download", "event"}, \
        f"the recorded step's transfers are not all before/after its kernels: {order[:first + 1]} ... {order[last:]}"
    return runner.tape.names, ex.classes, order, runner.tape.entries


# issue 23's step models for bytes and launches: batch 256 (host-only plans: the arena is never touched)
TRAFFIC_MODELS = ("resnet50", "resnet18-cifar")
TRAFFIC_BATCH = 256


def step_traffic(model, batch=TRAFFIC_BATCH):
    """``(plan, kernel names, per-kernel [launches, read, written], launches before merging the zero-fills,
    floor by region, [(fill, kernel)] of the recorded fills a kernel then only writes, {SIMT GEMM kernel:
    [layers]}, {uploaded input: bytes})`` of ``model``'s
    training step at ``batch``, recorded as ``dry_record_train_step`` does."""
    import dataclasses
    from cuda_kernels.traffic import overwritten_fills, step_floor, tape_traffic, touched_offsets
    plan = compile_step_plan(dataclasses.replace(model, batch=batch))
    tapes = []

    class Keep(_TapeStandIn):
        def __init__(self):
            super().__init__()
            tapes.append(self)
    names, _, _, entries = dry_record_train_step(plan, sgd(), Keep)
    table = tape_traffic([e for e in entries if e.kind == "kernel"])
    overwritten = overwritten_fills(tapes[-1].recorded_kernels)
    simt_gemms = {}
    for name, layer in tapes[-1].launch_layers:   # the SIMT GEMMs (``_conv``, ``_linear``; the tensor-core ones: mma_*)
        if name.startswith(("conv2d_", "linear_forward")):
            simt_gemms.setdefault(name, []).append(layer)
    kernels = [e for e in entries if e.kind == "kernel"]
    floor = step_floor(plan, touched_offsets(kernels, tapes[-1].arena_buffer))
    uploads = {e.name: e.nbytes for e in entries if e.kind == "upload"}
    return plan, names, table, tapes[-1].recorded, floor, overwritten, simt_gemms, uploads


def print_step_traffic(models=TRAFFIC_MODELS):
    """Bytes and launches per training step from the recorded tape, and the floor (issue 23, item 5)."""
    from cuda_kernels.traffic import totals
    from .step_common import TIMING_MODELS
    print(f"\nbytes and launches per training step (recorded tape, batch {TRAFFIC_BATCH}; every array argument a "
          f"kernel reads / writes counted once per launch; GB = 1e9 bytes):")
    for model in (m for m in TIMING_MODELS if m.name in models):
        plan, names, table, recorded, floor, overwritten, simt_gemms, uploads = step_traffic(model)
        gemm, other = totals(table, gemm=True), totals(table)
        fills = sum(row[0] for name, row in table.items() if name.startswith("fill_zero"))
        floor_bytes = sum(floor.values())
        print(f"  {model.name} b{TRAFFIC_BATCH}: {len(names)} launches ({recorded} recorded; zero-fills merged into "
              f"{fills}), GEMM {gemm[0]}, other {other[0]}")
        print(f"    {'kernel':44s} {'launches':>8s} {'read GB':>9s} {'written GB':>10s}")
        for name, (n, read, written) in sorted(table.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
            print(f"    {name:44s} {n:8d} {read / 1e9:9.3f} {written / 1e9:10.3f}")
        print(f"    {'GEMM total':44s} {gemm[0]:8d} {gemm[1] / 1e9:9.3f} {gemm[2] / 1e9:10.3f}")
        print(f"    {'non-GEMM total':44s} {other[0]:8d} {other[1] / 1e9:9.3f} {other[2] / 1e9:10.3f}")
        print("    floor (every tensor the step touches, once), by class: "
              + ", ".join(f"{region} {b / 1e9:.3f}" for region, b in sorted(floor.items(), key=lambda kv: -kv[1]))
              + f"; total {floor_bytes / 1e9:.3f} GB")
        print(f"    non-GEMM bytes / floor: {(other[1] + other[2]) / floor_bytes:.2f}")
        print(f"    recorded zero-fills of a buffer the next kernel only writes: {len(overwritten)}"
              + (f" (before {sorted(set(k for _, k in overwritten))})" if overwritten else ""))
        print("    SIMT GEMM kernels (layers the tensor cores do not take): "
              + ("; ".join(f"{k} at {', '.join(v)}" for k, v in simt_gemms.items()) or "none"))
        print("    convolutions on zero-padded channels (padded_conv): "
              + (", ".join(f"{p.name} {p.shape[-1]} -> {plan.tensor(p.half_padded).shape[-1]}"
                           for p in plan.params if p.half_padded >= 0) or "none"))
        print("    uploads per step (pinned host -> device, not in the bytes above): "
              + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in uploads.items())
              + f"; total {sum(uploads.values()) / 1e6:.1f} MB")
        print_step_prediction(model, other[1] + other[2], other[0])


def print_step_prediction(model, other_bytes, other_launches):
    """The AMP step's PREDICTED time on an H200 (``model.predict_step``) beside the PyTorch eager figure the model
    assumes (``model.PYTORCH_EAGER_AMP_ASSUMED``: where it comes from is written there)."""
    from .model import PYTORCH_EAGER_AMP_ASSUMED, conv_shapes, predict_step
    p = predict_step(conv_shapes(model.blueprint(), TRAFFIC_BATCH, model.hw), other_bytes, other_launches)
    line = (f"    PREDICTED step on an H200 (a model, not a measurement): {p.seconds * 1e3:.1f} ms = convolution GEMMs "
            f"{p.gemm_s * 1e3:.1f} + other kernels' bytes at 4.3 TB/s {p.other_s * 1e3:.1f} + {p.other_launches} "
            f"launch gaps {p.gaps_s * 1e3:.1f}")
    torch = PYTORCH_EAGER_AMP_ASSUMED.get(model.name.replace("-", "_"))
    if torch:
        line += (f"; PyTorch eager AMP ASSUMED {torch[0] * 1e3:.1f}-{torch[1] * 1e3:.1f} ms: ours / PyTorch's "
                 f"{p.seconds / torch[1]:.2f}-{p.seconds / torch[0]:.2f}x (predicted)")
    print(line)


def _fused_kinds(plan):
    from collections import Counter
    counts = Counter(plan.arch.layers[op.layer].kind for op in plan.graphs["train"].ops if op.direction == "forward")
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))


def dry_run_steps(only, used):
    """Everything of the step-* sections that needs no device; raises on any mismatch."""
    from planner.init import torch_shape
    selected = step_selection(only)
    if not selected:
        print("step sections: none selected by --only")
        return
    print(f"\nstep sections (dry): {', '.join(selected)} — plans compiled, each training step recorded as "
          f"CudaExecutor records it, launches type-checked against the kernel table")
    models = {}
    for section, chosen in selected.items():
        for model in chosen:
            models.setdefault((model.name, model.shape), (model, []))[1].append(section)
    print(f"  {'model':24s} {'input':>17s} {'sections':34s} {'ops':>4s} {'params':>11s} {'arena MiB':>9s} "
          f"{'launches':>8s}  fused kinds")
    plans, launches = {}, {}
    for (name, shape), (model, sections) in models.items():
        started = time.time()
        plan = plans[name] = compile_step_plan(model)
        plan.verify()
        names, classes, _, _ = dry_record_train_step(plan, sgd())
        used.update(names)
        launches[name] = len(names)
        assert classes == model.classes, f"{name}: the plan has {classes} classes, the model says {model.classes}"
        assert "count_correct" in names and {"sgd_step", "sgd_step_vec4"} & set(names), \
            f"{name}: the recorded step lacks its loss/update"
        print(f"  {name:24s} {str(shape):>17s} {', '.join(sections):34s} {len(plan.graphs['train'].ops):4d} "
              f"{plan.params_trainable:11,d} {plan.memory.arena_bytes / MIB:9.1f} {len(names):8d}  "
              f"{_fused_kinds(plan)} ({time.time() - started:.1f} s)")
    if "step-check" in selected:
        for model in selected["step-check"]:
            reference = compile_step_plan(model, fuse=False, amp=False)
            fused = {p.name: torch_shape(p) for p in plans[model.name].params}
            fp32 = {p.name: torch_shape(p) for p in reference.params}
            assert fused == fp32, f"{model.name}: the fp32 reference plan's parameters differ from the fused AMP " \
                                  f"plan's: {sorted(set(fused.items()) ^ set(fp32.items()))[:4]}"
            print(f"  step-check {model.name}: fp32 reference plan ({len(reference.graphs['train'].ops)} ops) has the "
                  f"fused AMP plan's {len(fp32)} parameter names and shapes: weights move across")
        a = {"w": np.array([3.0, 4.0]), "b": np.array([0.0, 0.0]), "c": np.array([1.0])}
        errors = relative_errors({"w": np.array([3.0, 4.1]), "b": np.array([0.05, 0.0]), "c": np.array([np.nan])}, a)
        assert math.isclose(errors["w"], 0.02) and math.isclose(errors["b"], 1.0) and errors["c"] == math.inf, errors
        print("  step-check comparison self-test (norm floor, non-finite values): ok")
    if "step-replay" in selected:
        for model in selected["step-replay"]:
            print(f"  step-replay {model.name}: graph support here: {graph_support()}")
    if "step-timing" in selected:
        dry_run_torch(selected["step-timing"], plans, launches)


def dry_run_torch(models, plans, launches):
    """The PyTorch twins of the timed models: parameter counts, names and shapes against our plans
    (on the meta device), and the timed step function run once on the CPU at a tiny size."""
    from planner.init import torch_shape
    try:
        import torch
    except Exception as error:
        print(f"  step-timing PyTorch side NOT CHECKED: PyTorch is not importable ({error})")
        return
    for model in models:
        plan = plans[model.name]
        with torch.device("meta"):
            twin = model.make_torch()
        count = torch_models().count_params(twin)
        theirs = {k: tuple(v.shape) for k, v in twin.state_dict().items()}
        ours = {p.name: torch_shape(p) for p in plan.params}
        assert count == plan.params_trainable, f"{model.name}: torch_models.{model.torch_model} has {count:,} " \
                                               f"parameters, our plan {plan.params_trainable:,}"
        assert theirs == ours, f"{model.name}: state_dict names/shapes differ: " \
                               f"{sorted(set(theirs.items()) ^ set(ours.items()))[:4]}"
        started = time.time()
        tiny = StepModel(model.name, model.blueprint, 2, 32, model.about, model.classes, model.torch_model)
        net = model.make_torch().to(memory_format=torch.channels_last).train()
        x, y = torch_inputs(tiny, "cpu")
        step = make_torch_step(net, x, y, "cpu", amp=False)
        losses = [float(step().detach()) for _ in range(2)]
        assert all(math.isfinite(v) for v in losses), f"{model.name}: PyTorch CPU step gave {losses}"
        print(f"  step-timing {model.name}: torch_models.{model.torch_model}({model.classes}) has our plan's "
              f"{count:,} parameters and {len(ours)} state_dict names/shapes; its timed step ran on the CPU at "
              f"batch 2, 32x32 without AMP: losses {losses[0]:.3f}, {losses[1]:.3f} ({time.time() - started:.1f} s)")
    print("  step-timing: torch.compile is not exercised in the dry run (minutes of compiling on a CPU); "
          "on the GPU its failures are printed and noted, not fatal")
    rows = {}
    for model in models:
        recorded = {"launches": launches[model.name]}
        rows[model.name] = {"model": model, "arena_bytes": plans[model.name].memory.arena_bytes,
                            "ours eager": recorded, "ours graph": recorded}
    print(format_timing_table(rows, dry=True))


def dry_run(only):
    started = time.time()
    kernels = all_kernels()
    used = set()
    for batch, label in [(CHECK_BATCH, "cross-check"), (TIMING_BATCH, "timing")]:
        rows = {n: b for n, b in table(batch).items() if only in n}
        print(f"{label} rows at batch {batch}:")
        for name, build in rows.items():
            case = build(HostStandIns(), None)
            launcher = DryLauncher()
            case.record(launcher)
            used.update(launcher.names)
            tensor_core = [n for n in launcher.names if n.startswith("mma_")]
            assert bool(tensor_core) == name.endswith(" mma"), \
                f"row {name!r}: launches {launcher.names}; an \" mma\" row must run tensor-core kernels, others none"
            outputs = ", ".join(f"{k}{tuple(v.shape)}" for k, v in case.outputs.items())
            print(f"  {name:28s} {len(launcher.names)} launches ({', '.join(dict.fromkeys(launcher.names))}) -> "
                  f"{outputs}; {case.bytes / 1e6:.1f} MB moved")
    record, _ = graph_case(HostStandIns())
    launcher = DryLauncher()
    record(launcher)
    used.update(launcher.names)
    print(f"graph-vs-eager: {len(launcher.names)} launches; graph support here: {graph_support()}")
    dry_run_steps(only, used)
    if not only or only in "traffic":
        print_step_traffic()
    unknown, unused = used - set(kernels), set(kernels) - used
    unknown -= set(all_mma_kernels())   # the tensor-core kernels' own table (cuda_kernels/mma_kernels.py)
    assert not unknown, f"launched kernels missing from the table: {sorted(unknown)}"
    if not only:
        assert not unused, f"kernels the GPU check never runs: {sorted(unused)}"
    print(f"dry run ok: {len(used & set(kernels))} of {len(kernels)} table kernels (and {len(used - set(kernels))} "
          f"tensor-core kernels) would run ({time.time() - started:.1f} s)")
