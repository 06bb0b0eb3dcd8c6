"""`Model`: a trained network as a value for inference (weights + BluePrint + the input it expects).

A `Model` holds the weights in PyTorch layouts and an `InputSpec`: the sample shape
(H, W, C), the layout (NHWC), the dtype of the training data and the normalisation the
DataLoader applied during training. `logits(x)` / `predict(x)` take raw data as it was in the
training set (uint8 images too), normalise it exactly as the DataLoader did
(``(pixel / divisor - mean[c]) / std[c]`` in float64, rounded to float32) and run the eval graph
on the CPU path. Eval plans are compiled on demand, one per batch shape, and cached, so the
last partial batch gets its own exact shape (nothing is padded).

Like a PyTorch module the weights change in place (`load_state_dict`); the input spec is frozen.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from blueprint._errors import ConfigError
from blueprint._layer import BluePrint
from blueprint._parse import parse_as

LAYOUT = "NHWC"
INPUT_DTYPES = ("uint8", "float32")
UINT8_SCALE = 255.0          # as blueprint.task.data: uint8 pixels are divided by this before mean/std
DEFAULT_BATCH = 32
COLOUR_CHANNELS = (1, 3)     # channel counts for which an NCHW array can be told from an NHWC one


@dataclass(frozen=True)
class InputSpec:
    """What the network was trained on: ``sample_shape`` (H, W, C), ``dtype`` of the raw data
    ("uint8" or "float32"), ``mean``/``std`` per channel (units after uint8 -> /255; None: no
    normalisation) and, for float32 data, the per-channel ``low``/``high`` of the training set
    (used to refuse data in other units)."""

    sample_shape: tuple[int, int, int]
    dtype: str = "float32"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    layout: str = LAYOUT

    def __post_init__(self):
        shape = tuple(self.sample_shape)
        if len(shape) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
            raise ConfigError(f"InputSpec(sample_shape): expected (H, W, C) positive ints, got {self.sample_shape!r}")
        object.__setattr__(self, "sample_shape", shape)
        if self.dtype not in INPUT_DTYPES:
            raise ConfigError(f"InputSpec(dtype): expected one of {INPUT_DTYPES}, got {self.dtype!r}")
        if self.layout != LAYOUT:
            raise ConfigError(f"InputSpec(layout): the network runs {LAYOUT}; got {self.layout!r}")
        channels = shape[-1]
        if (self.mean is None) != (self.std is None):
            raise ConfigError("InputSpec: give both mean and std (or neither, for no normalisation)")
        for name in ("mean", "std", "low", "high"):
            value = getattr(self, name)
            if value is None:
                continue
            values = tuple(float(v) for v in np.broadcast_to(np.asarray(value, np.float64), (channels,)))
            if not all(np.isfinite(values)) or (name == "std" and min(values) <= 0):
                raise ConfigError(f"InputSpec({name}): expected {channels} finite values"
                                  f"{' > 0' if name == 'std' else ''}, got {value!r}")
            object.__setattr__(self, name, values)

    def as_state(self) -> dict:
        return {"layout": self.layout, "sample_shape": list(self.sample_shape), "dtype": self.dtype,
                "mean": _listed(self.mean), "std": _listed(self.std), "low": _listed(self.low),
                "high": _listed(self.high)}

    @staticmethod
    def from_state(path, state) -> "InputSpec":
        if not isinstance(state, dict):
            raise ConfigError(f"{path}: this checkpoint stores no input normalisation (written before it was "
                              "recorded); re-save it from a task: DeepLearningTask.load(path).data(train=...)"
                              ".resume(path).save(path)")
        try:
            return InputSpec(tuple(state["sample_shape"]), state["dtype"], state["mean"], state["std"],
                             state.get("low"), state.get("high"), state["layout"])
        except (KeyError, TypeError) as error:
            raise ConfigError(f"{path}: the checkpoint's input record is malformed ({error!r}); "
                              "use another checkpoint") from error

    def normalise(self, x: np.ndarray, where: str) -> np.ndarray:
        """Raw data as in the training set -> the float32 NHWC batch the network was trained on."""
        x = self.check(x, where)
        divisor = UINT8_SCALE if x.dtype == np.uint8 else 1.0
        if self.mean is None:
            return np.ascontiguousarray(x, np.float32) if divisor == 1.0 else (x / divisor).astype(np.float32)
        mean, std = np.asarray(self.mean), np.asarray(self.std)
        return ((x.astype(np.float64) / divisor - mean) / std).astype(np.float32)

    def check(self, x, where: str) -> np.ndarray:
        """Refuse what the network would silently get wrong: another layout, dtype or value range."""
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{where}: expected a numpy array of {self.dtype} images (N, H, W, C); "
                            f"got {type(x).__name__}. Convert with np.asarray(x)")
        h, w, c = self.sample_shape
        expected = f"(N, {h}, {w}, {c}) {self.layout} {self.dtype}"
        if x.ndim == 3 and x.shape == self.sample_shape:
            raise ValueError(f"{where}: got one sample {x.shape}; expected a batch {expected}. Pass x[None]")
        if c == 1 and x.ndim in (2, 3) and x.shape[-2:] == (h, w):   # grayscale images without their channel axis
            fix = "x[..., None]" if x.ndim == 3 else "x[None, ..., None]"
            raise ValueError(f"{where}: got {x.shape}, without the channel axis; expected {expected}. Pass {fix}")
        if x.ndim != 4:
            raise ValueError(f"{where}: expected {expected}, got shape {x.shape}")
        if x.shape[1:] != self.sample_shape:
            if c in COLOUR_CHANNELS and x.shape[1] == c and x.shape[2:] == (h, w):
                raise ValueError(f"{where}: got {x.shape}, which is NCHW; the network takes {self.layout} "
                                 f"{expected}. Pass x.transpose(0, 2, 3, 1)")
            raise ValueError(f"{where}: expected {expected}, got shape {x.shape}")
        if self.dtype == "uint8" and x.dtype != np.uint8:
            raise TypeError(f"{where}: the network was trained on uint8 images (0..255, normalised inside); got "
                            f"{x.dtype}. Pass the images as uint8, as in the training set (and not divided by 255 "
                            "or normalised)")
        if self.dtype == "float32":
            if x.dtype != np.float32:
                raise TypeError(f"{where}: the network was trained on float32 data; got {x.dtype}. Pass "
                                "x.astype(np.float32), in the units of the training set")
            if not np.isfinite(x).all():
                raise ValueError(f"{where}: the data contains NaN or Inf values; clean them first")
            self._check_range(x, where)
        return x

    def _check_range(self, x: np.ndarray, where: str) -> None:
        """Values far outside the training set's range are data in other units (0..255 for 0..1,
        or already normalised): refused, as the answers would be wrong without notice."""
        if self.low is None or not x.size:
            return
        low, high = np.asarray(self.low), np.asarray(self.high)
        margin = np.maximum(high - low, np.finfo(np.float32).eps)   # the training range's own width
        found_low, found_high = x.min(axis=(0, 1, 2)), x.max(axis=(0, 1, 2))
        bad = (found_low < low - margin) | (found_high > high + margin)
        if bad.any():
            ch = int(np.argmax(bad))
            raise ValueError(f"{where}: channel {ch} holds values in [{found_low[ch]:g}, {found_high[ch]:g}] but the "
                             f"training data was in [{low[ch]:g}, {high[ch]:g}]; pass the data in the training set's "
                             "units, not rescaled or normalised (the model normalises it itself)")


def _finite_logits(logits: np.ndarray) -> np.ndarray:
    """Logits with a NaN or Inf are refused, never ranked: the weights (or the input) are broken."""
    finite = np.isfinite(logits).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise ValueError(f"the model's logits are not finite (NaN/Inf) for {len(bad)} of {len(logits)} samples "
                         f"(first: sample {bad[0]}); its weights diverged or the input is far outside the training "
                         "data's range; use a checkpoint of a run that did not diverge")
    return logits


def _listed(value):
    return None if value is None else list(value)


class Model:
    """A network with weights, ready for inference on the CPU.

    >>> import numpy as np
    >>> from blueprint import zoo
    >>> model = Model(zoo.small_cnn(), InputSpec((8, 8, 1), "uint8", mean=0.3, std=0.4))
    >>> model.logits(np.zeros((3, 8, 8, 1), np.uint8)).shape
    (3, 10)
    >>> model.predict(np.zeros((3, 8, 8, 1), np.uint8), batch_size=2).shape
    (3,)
    """

    def __init__(self, blueprint: BluePrint, spec: InputSpec | tuple, seed: int = 0):
        if not isinstance(blueprint, BluePrint):
            raise TypeError(f"Model(blueprint): expected a BluePrint (e.g. zoo.resnet18()), got "
                            f"{type(blueprint).__name__}")
        self.blueprint = blueprint
        self.spec = spec if isinstance(spec, InputSpec) else InputSpec(tuple(spec))
        self.seed = seed
        self._executors: dict[int, object] = {}
        self._lock = threading.RLock()   # guards the executor cache and weight loads; each executor has its own
        self._weights = self._executor(1).state_dict()   # the initial weights of `seed`
        self.classes = self._executors[1].classes

    # ---- weights ---------------------------------------------------------------------------------------
    @staticmethod
    def load(path) -> "Model":
        """The model of a checkpoint written by `DeepLearningTask.save` (or `fit` with `.checkpoint`),
        from the file alone: BluePrint, weights and input normalisation."""
        from blueprint.task._checkpoint import load_checkpoint

        tensors, state = load_checkpoint(path)
        blueprint = parse_as(state.get("blueprint"), f"{path}: model", (BluePrint,))   # parsed, never evaluated
        model = Model(blueprint, InputSpec.from_state(path, state.get("input")))
        model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
        return model

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and BN statistics by name, in PyTorch layouts (copies)."""
        return {name: value.copy() for name, value in self._weights.items()}

    def load_state_dict(self, state: dict, strict: bool = True) -> "Model":
        """Load PyTorch-layout weights (numpy arrays or torch tensors; torchvision's keys for zoo
        models). Every key, shape and value is checked first; on any problem nothing is loaded."""
        with self._lock:
            return self._load_state_dict(state, strict)

    def _load_state_dict(self, state: dict, strict: bool) -> "Model":
        probe = self._executor(1)
        probe.load_state_dict(state, strict)
        self._weights = probe.state_dict()
        for executor in self._executors.values():
            if executor is not probe:
                executor.load_state_dict(self._weights)
        return self

    # ---- inference ---------------------------------------------------------------------------------------
    def logits(self, x: np.ndarray, batch_size: int = DEFAULT_BATCH) -> np.ndarray:
        """float32 logits (N, classes) for raw data as in the training set (NHWC, its dtype)."""
        return _finite_logits(self._forward(self.spec.normalise(x, "Model.logits(x)"), batch_size))

    def probabilities(self, x: np.ndarray, batch_size: int = DEFAULT_BATCH) -> np.ndarray:
        """Softmax of the logits, float32 (N, classes)."""
        z = self.logits(x, batch_size).astype(np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)

    def predict(self, x: np.ndarray, batch_size: int = DEFAULT_BATCH) -> np.ndarray:
        """The predicted class of every sample (int64, N)."""
        return self.logits(x, batch_size).argmax(axis=1).astype(np.int64)

    def export_onnx(self, path, batch: int | None = None) -> Path:
        """Write the eval graph as an ONNX model (NCHW float32 input "input", already normalised;
        output "logits"); ``batch=None`` makes the batch axis dynamic. Needs ``pip install onnx``."""
        from blueprint._onnx import export_onnx
        return export_onnx(self, path, batch)

    def eval_plan(self, batch: int = 1):
        """The compiled eval plan (CPU path, fp32, unfused) for batches of ``batch`` samples."""
        return self._executor(batch).plan

    def _forward(self, x: np.ndarray, batch_size: int) -> np.ndarray:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if not len(x):
            return np.zeros((0, self.classes), np.float32)
        pieces = [self._executor(len(piece)).forward(np.ascontiguousarray(piece))
                  for piece in (x[start:start + batch_size] for start in range(0, len(x), batch_size))]
        return np.concatenate(pieces).astype(np.float32, copy=False)

    def _executor(self, batch: int):
        """The CPU executor of the eval plan for ``batch`` samples, compiled on first use and cached."""
        with self._lock:
            return self._executors[batch] if batch in self._executors else self._new_executor(batch)

    def _new_executor(self, batch: int):
        from planner import ArchPlan
        from planner.compiler import Compiler

        h, w, c = self.spec.sample_shape
        arch = ArchPlan.from_blueprint(self.blueprint, in_channels=c, fuse=False, amp=False)
        plan = Compiler(arch).compile({"eval": (batch, h, w, c)}, training=False)
        from cpu_ref import CpuExecutor   # after planning: a model the planner refuses needs no kernels (nor numba)
        executor = CpuExecutor(plan, seed=self.seed)
        if self._executors:
            executor.load_state_dict(self._weights)
        self._executors[batch] = executor
        return executor

    def __repr__(self) -> str:
        return f"Model({self.blueprint.name or 'BluePrint'}, input={self.spec.sample_shape} {self.spec.dtype}, " \
               f"classes={self.classes})"
