"""`CudaExecutor`: runs a CompiledPlan (AMP, fused or not) with numba.cuda kernels in one device arena.

One ``DeviceArena`` sized by the MemoryPlan holds everything; every tensor is a view made
once per variant. Each (variant, purpose) step is recorded once as a launch tape
(``cuda_kernels._ops``) whose arguments are arena views only, then replayed: eagerly, or
captured as one CUDA graph and replayed with one graph launch per step (``graph.StepRunner``).
Per-step values live in the arena: the batch, the labels and the learning rate are copied
into their fixed slots before the replay (a padded stem's batch with its real channels: the step's first kernel
pads it into the input slot, ``_uploaded_as``); the step counters, the dynamic loss scale
(PyTorch ``GradScaler`` semantics: start 2**16, halve and skip the step on inf/nan, double
after 2,000 clean steps) and the overflow flag are computed on the device.

Every transfer is ordered on the executor's one stream (``cuda_kernels.transfer``): a recorded
step is uploads (pinned, double-buffered staging) -> kernels -> downloads -> an event, and the
host waits on that event to read the loss and the number of correct predictions.
``submit_train_step`` returns at once (a ``PendingStep``); ``train_steps`` submits step k+1
before it reads step k's result, so the host prepares the next batch while the device runs.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from planner.arena_budget import check_arena_fits
from planner.executor_api import ExecutorBase, InputError, step_result
from planner.init import initial_parameters
from planner.plan import Role

from . import elementwise
from .arena import DeviceArena
from .collective import SINGLE_REPLICA
from .graph import StepRunner, graph_support, new_stream, synchronize
from .mma_ops import DEFAULT_KERNELS, gemm_kernels
from ._ops import StepContext, cast_half_weights, record_op
from .optim import INIT_LOSS_SCALE
from .registry import SIMULATOR
from ._table import CUDA
from .tape import Immediate, LaunchTape
from .transfer import Staging, record_transfers

REPLAY_MODES = ("auto", "graph", "eager")
# What each recorded step uploads before and downloads after its kernels (names of plan.io slots).
STEP_INPUTS = {"train": ("input", "labels", "lr"), "eval": ("input", "labels"), "forward": ("input",)}
STEP_OUTPUTS = {"train": ("loss", "correct"), "eval": ("loss", "correct", "logits"), "forward": ("logits",)}


def cuda_unavailable_reason() -> str:
    """'' where kernels can run here (a GPU, or the simulator), else why not."""
    if SIMULATOR:
        return ""
    try:
        if cuda.is_available():
            return ""
    except Exception as error:   # a broken driver install raises instead of answering False
        return f"the CUDA driver could not be queried ({error})"
    return ("no CUDA GPU is available to numba (numba.cuda.is_available() is False); train with .device('cpu'), "
            "or set NUMBA_ENABLE_CUDASIM=1 before numba is imported to run the kernels in the simulator (slow)")


class CudaExecutor(ExecutorBase):
    """Train and evaluate an AMP CompiledPlan on the GPU (or in numba's CUDA simulator).

    Same interface as `cpu_ref.CpuExecutor`: ``forward``, ``evaluate_batch``, ``train_step``,
    ``gradients`` (unscaled), ``state_dict`` / ``load_state_dict`` (PyTorch layouts, fp32),
    ``optimizer_state`` / ``load_optimizer_state``. ``replay``: "graph" (one CUDA graph launch
    per step), "eager" (one launch per kernel) or "auto" (graph where the CUDA graph API is
    available, else eager — the simulator has no graphs). ``init_loss_scale``: the dynamic loss
    scale's start (PyTorch ``GradScaler(init_scale=2.0**16)``); a step whose scaled gradients
    overflow fp16 is skipped and the scale halved, so early steps of small-batch runs may skip.
    ``separate_buffers``: every step-local tensor gets its own allocation instead of its planned
    arena offset; results must not change (a check of the memory plan, as on the CPU path).
    ``kernels``: "mma" (tensor-core convolutions and fc layers, SIMT where they do not apply) or
    "simt" (the reference kernels), so one GPU step can compare the two.

    >>> from blueprint import zoo                                  # doctest: +SKIP
    >>> from planner import ArchPlan
    >>> from planner.compiler import Compiler
    >>> arch = ArchPlan.from_blueprint(zoo.resnet20(), fuse=True, amp=True)
    >>> plan = Compiler(arch).compile({"train": (128, 32, 32, 3), "eval": (256, 32, 32, 3)})
    >>> ex = CudaExecutor(plan, seed=0)
    >>> loss = ex.train_step(x, y, lr=0.1)
    """

    def __init__(self, plan, loss=None, optimizer=None, seed: int = 0, replay: str = "auto",
                 init_loss_scale: float = INIT_LOSS_SCALE, separate_buffers: bool = False,
                 kernels: str = DEFAULT_KERNELS):
        why = cuda_unavailable_reason()
        if why:
            raise RuntimeError(f"CudaExecutor: {why}")
        if not plan.arch.amp:
            raise ValueError("CudaExecutor runs AMP plans (fp16 activations, fp32 master weights): build the ArchPlan "
                             "with amp=True (and fuse=True for the fused kernels); fp32 plans run on CpuExecutor")
        if replay not in REPLAY_MODES:
            raise ValueError(f"CudaExecutor(replay): expected one of {REPLAY_MODES}, got {replay!r}")
        if not (np.isfinite(init_loss_scale) and init_loss_scale > 0):
            raise ValueError(f"CudaExecutor(init_loss_scale): expected a finite number > 0, got {init_loss_scale!r}")
        CUDA.check_plan(plan)
        super().__init__(plan, loss, optimizer, seed)
        self._separate = separate_buffers
        gemm_kernels(kernels)   # kernels: "mma" (tensor cores, SIMT where they do not apply) or "simt"
        self.kernels = kernels
        self.replay = ("graph" if graph_support()[0] else "eager") if replay == "auto" else replay
        self.stream = new_stream()
        check_arena_fits(plan, _device_free_bytes(), "GPU")
        self.arena = DeviceArena(plan.memory.arena_bytes)
        self.arena.zero(Immediate(self.stream))
        self._persistent = {t.id: self._view(t, t.shape) for t in plan.tensors if not t.graph}
        self._tracked = {p.tensor for p in plan.params if p.role is Role.NUM_BATCHES_TRACKED}
        self._bn_forwards = 0   # training forwards since the BN counters were last written
        self._regions = {name: self._region_view(name, dtype) for name, dtype in
                         (("params", np.float32), ("grads", np.float32), ("optim", np.float32),
                          ("weights16", np.float16))}
        self._scalars = {name: self._persistent[tid] for name, tid in plan.io.items()
                         if plan.tensor(tid).region == "scalars"}
        self._half = {p.tensor: self._persistent[p.half] for p in plan.params if p.half >= 0}
        # convolutions with Cin % 8 != 0 on the aligned tensor-core path (``padded_conv``): a weight copy padded
        # with zero channels, and the input padded to match (a stem: the input slot, written by the step's first
        # kernel from the uploaded batch, ``_uploaded_as``); the SIMT kernels take neither
        mma = kernels == "mma"
        self._padded_weights = tuple((self._persistent[p.tensor], self._persistent[p.half_padded])
                                     for p in plan.params if p.half_padded >= 0 and mma)
        self._padded = {p.tensor: self._persistent[p.half_padded] for p in plan.params if p.half_padded >= 0 and mma}
        self._input_padded = mma and "input_unpadded" in plan.io
        self._views: dict[str, dict[int, object]] = {}
        self._runners: dict[tuple[str, str], StepRunner] = {}
        self._staging: dict[tuple[str, str], Staging] = {}
        self.collectives = SINGLE_REPLICA   # data parallel: blueprint.distributed installs NCCL here
        for tid, value in initial_parameters(plan, seed).items():
            self._write(tid, value)
        self._upload_scalar("loss_scale", np.float32(init_loss_scale))
        self._refresh_half_weights()

    # ---- arena views -----------------------------------------------------------------------------------
    def _view(self, t, shape):
        """A device view of tensor ``t``; int64 labels and counters are read as int32 by the kernels."""
        dtype = np.dtype(t.dtype)
        shape = tuple(shape) or (1,)
        if dtype == np.int64 and t.region in ("io", "scalars"):
            dtype = np.dtype(np.int32)
        if self._separate and t.graph:
            return cuda.device_array(shape, dtype)
        return self.arena.view(t.offset, shape, dtype)

    def _region_view(self, region, dtype):
        start, nbytes = self.plan.memory.regions[region]
        if nbytes == 0:
            return self.arena.view(0, (0,), dtype)
        return self.arena.view(start, (nbytes // np.dtype(dtype).itemsize,), dtype)

    def _variant_views(self, variant):
        if variant not in self._views:
            plan, graph = self.plan, self.plan.variants[variant].graph
            views = dict(self._persistent)
            for t in plan.tensors:
                if t.graph == graph or t.region == "io":
                    views[t.id] = self._view(t, t.shape_in(variant))
            # The plan pads the input slot's channels to a multiple of 8; where no stem reads it padded (the
            # SIMT kernels, or a reader that is not a convolution), the batch is stored with its real channels.
            if not self._input_padded:
                t = plan.tensor(plan.io["input"])
                views[t.id] = self._view(t, t.shape_in(variant)[:3] + (plan.arch.in_channels,))
            self._views[variant] = views
        return self._views[variant]

    # ---- memory accessors ------------------------------------------------------------------------------
    def _download(self, view):
        """A host copy of ``view`` after everything queued on the stream (the host waits here)."""
        host = view.copy_to_host(stream=self.stream)
        synchronize(self.stream)
        return host

    def _upload(self, view, host):
        """Copy ``host`` into ``view`` on the stream, after everything queued there; returns when done."""
        view.copy_to_device(np.ascontiguousarray(host.reshape(view.shape).astype(view.dtype)), stream=self.stream)
        synchronize(self.stream)

    def _read(self, tid):
        t = self.plan.tensor(tid)
        value = self._download(self._persistent[tid]).reshape(t.shape).astype(t.dtype)
        if tid in self._tracked:
            value = value + self._bn_forwards
        return value

    def _write(self, tid, value):
        t = self.plan.tensor(tid)
        value = np.asarray(value).astype(t.dtype)
        if tid in self._tracked:
            value = value - self._bn_forwards
        self._upload(self._persistent[tid], value)
        if t.region == "params":
            self._half_dirty = True

    def gradients(self) -> dict[str, np.ndarray]:
        """Parameter gradients of the last train step, by name, in PyTorch layout, unscaled."""
        scale = np.float32(self._last_loss_scale())
        return {name: grad / scale for name, grad in super().gradients().items()}

    def _last_loss_scale(self):
        """The scale the last step's gradients carry (the scale is updated after the step)."""
        scale = self.loss_scale
        if self.skipped_last_step:
            return scale * 2
        if self.step_count and self._scalar("good_steps") == 0:
            return scale / 2
        return scale

    def _scalar(self, name):
        return self._download(self._scalars[name])[0]

    def _upload_scalar(self, name, value):
        self._upload(self._scalars[name], np.array([value]))

    def _refresh_half_weights(self):
        cast_half_weights(Immediate(self.stream), self._regions["params"], self._regions["weights16"],
                          self._padded_weights)
        self._half_dirty = False

    # ---- steps -----------------------------------------------------------------------------------------
    def _uploaded_as(self, name):
        """The plan.io slot the host's ``name`` is uploaded into: the input of a padded stem goes to its real-channel
        slot ``input_unpadded`` (a third of the bytes for RGB), which the step's first kernel writes into the padded
        ``input`` slot, zeros in the padded channels; every other input goes straight to its slot."""
        return "input_unpadded" if name == "input" and self._input_padded else name

    def _runner(self, variant, purpose):
        """The recorded step of ``variant``: "train", "eval" (forward + loss) or "forward"."""
        key = (variant, purpose)
        if key not in self._runners:
            views = self._variant_views(variant)
            ctx = StepContext(self.plan, views, self._half, self._scalars, self._regions, self.seed,
                              self.loss.smoothing, self.optimizer, self.kernels, self.collectives,
                              self._padded_weights, self._padded)
            uploaded = {name: views[self.plan.io[self._uploaded_as(name)]] for name in STEP_INPUTS[purpose]}
            staging = Staging(uploaded, {name: views[self.plan.io[name]] for name in STEP_OUTPUTS[purpose]})

            def kernels(tape):
                if self._uploaded_as("input") != "input":   # the step's first kernel: the batch into the padded slot
                    elementwise.channel_pad_forward(tape, uploaded["input"], views[self.plan.io["input"]])
                self._run_schedule(self.plan.variants[variant].graph, views, lambda op: record_op(tape, ctx, op),
                                   forward_only=purpose == "forward", tape=tape)
            tape = LaunchTape()
            record_transfers(tape, staging, kernels)
            if not self._separate:   # separate buffers are not arena views: their fills stay as recorded
                tape.coalesce_zero_fills(self.arena.buffer)
            self._runners[key] = StepRunner(tape, self.replay)
            self._staging[key] = staging
        return self._runners[key]

    def _submit(self, variant, purpose, **inputs):
        """Stage ``inputs`` (host values by slot name), queue the step on the stream; returns at once."""
        if self._half_dirty:
            self._refresh_half_weights()
        runner, staging = self._runner(variant, purpose), self._staging[(variant, purpose)]
        turn = staging.begin(inputs)
        runner.run(self.stream)
        return PendingStep(staging, turn)

    def runners_recorded(self) -> bool:
        """Whether a step has been recorded (its tape holds the collectives of that time)."""
        return bool(self._runners)

    @property
    def replay_in_use(self) -> str:
        """How the recorded steps replay: "graph", "eager", or "eager (fell back: <why>)" after a failed capture."""
        reasons = [runner.reason for runner in self._runners.values() if runner.fell_back]
        return f"eager (fell back: {reasons[0]})" if reasons else self.replay

    # ---- the steps (checks, variant choice and bookkeeping: ExecutorBase) ---------------------------------
    def _forward(self, variant, graph, x):
        """The logits as fp16 host values (the base returns their fp32 copy)."""
        out = self._submit(variant, "forward", input=x).outputs()
        if graph == "train":
            self._bn_forwards += 1
        return out["logits"]

    def _evaluate(self, variant, x, y):
        out = self._submit(variant, "eval", input=x, labels=y).outputs()
        return out["loss"], out["correct"], out["logits"]

    def _train(self, variant, x, y, lr):
        """Queue one training step (forward, loss, backward, overflow check, update skipped on overflow,
        loss scale, fp16 weight copies) and return at once; ``.result()`` waits for ``(loss, correct)``.
        Read it before submitting two more steps (its staging buffers are reused then)."""
        pending = self._submit(variant, "train", input=x, labels=y, lr=lr)
        self._bn_forwards += 1
        return pending

    @property
    def loss_scale(self) -> float:
        return float(self._scalar("loss_scale"))

    @property
    def skipped_last_step(self) -> bool:
        """True when the last step's gradients overflowed and its update was skipped."""
        return bool(self._scalar("overflow"))

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The base state plus the dynamic loss scale and the device's step counters (exact resume)."""
        state = super().optimizer_state()
        for name in ("loss_scale", "good_steps", "step", "iteration"):
            state["amp." + name] = self._download(self._scalars[name]).copy()
        return state

    def load_optimizer_state(self, state: dict) -> None:
        super().load_optimizer_state(state)
        for name in ("step", "iteration"):
            self._upload_scalar(name, self.step_count)
        for name in ("loss_scale", "good_steps", "step", "iteration"):
            if "amp." + name in state:
                self._upload_scalar(name, np.asarray(state["amp." + name]).reshape(-1)[0])


class PendingStep:
    """A submitted step: ``outputs()`` waits on its "done" event and returns host copies of its outputs."""

    def __init__(self, staging, turn):
        self._staging, self.turn = staging, turn

    def outputs(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in self._staging.result(self.turn).items()}

    def result(self) -> tuple[float, int]:
        """``(loss, number correct)`` of a training or eval step."""
        out = self.outputs()
        return step_result(out["loss"], out["correct"])


__all__ = ["CudaExecutor", "InputError", "PendingStep", "cuda_unavailable_reason"]


def _device_free_bytes() -> int | None:
    """Free memory of the current GPU, or None where numba cannot tell (the simulator)."""
    try:
        return int(cuda.current_context().get_memory_info().free)
    except Exception:   # noqa: BLE001 - the simulator and old drivers lack it: then the arena is not checked
        return None
