"""What the step-* sections of the GPU check share: their models and which of them ``--only``
selects, plans, batches and the optimizer, tensor comparisons, device-memory release, the run's
crash reports."""
import math
import sys
from dataclasses import dataclass

import numpy as np
from numba import cuda


# The step-* sections run whole training steps of CompiledPlans on ``cuda_kernels.CudaExecutor``
# (fused AMP plans): against the fp32 CPU path (step-check), graph replay against eager replay
# (step-replay), and images/s against PyTorch (step-timing). ``--only`` picks a section by name
# ("step" picks all three) or models by name ("resnet50").
STEP_SECTIONS = ("step-check", "step-replay", "step-timing")
MOMENTUM, CHECK_LR, TIMING_LR = 0.9, 0.1, 0.01
LOSS_TOL, GRAD_TOL, NORM_FLOOR = 1e-2, 2e-2, 1e-2        # first step, fused AMP vs fp32
CHECK_SCALES = (2.0 ** 16, 2.0 ** 12, 2.0 ** 8)           # GradScaler's start first; lower ones if it overflows
REPLAY_STEPS, REPLAY_SCALE, REPLAY_LOSS_TOL, REPLAY_STATE_TOL = 5, 2.0 ** 12, 1e-5, 1e-4
TIMED_S, WARMUP_STEPS, MAX_TIMED_STEPS = 3.0, 2, 60       # per timed candidate
COMPILE_RESERVE_S = 100       # torch.compile is only tried with this much of the budget left
SECTION_RESERVE_S = 20        # a step section (or model) is only started with this much left
DEFAULT_BUDGET_S = 470        # the whole run: the issue asks for under 8 minutes on an H200
MIB = 2.0 ** 20


@dataclass(frozen=True)
class StepModel:
    """A network of the step-* sections: how to build it, its batch, and its PyTorch twin."""
    name: str
    blueprint: object             # () -> BluePrint
    batch: int
    hw: int
    about: str
    classes: int = 10
    torch_model: str = ""         # tests/support/torch_models.py: <torch_model>(classes), same parameter names
    optional: bool = False        # timed after the required models, only if the budget allows

    @property
    def shape(self):
        return (self.batch, self.hw, self.hw, 3)

    @property
    def label(self):
        return f"{self.name} b{self.batch} {self.hw}x{self.hw}x3"

    def make_torch(self):
        return getattr(torch_models(), self.torch_model)(self.classes)


def torch_models():
    """tests/support/torch_models.py (torchvision's definitions, and CIFAR nets of its blocks)."""
    from tests.support import torch_models   # run from the repository root (python -m benchmarks.gpu.check)
    return torch_models


def zoo_model(name, *args):
    def make():
        from blueprint import zoo
        return getattr(zoo, name)(*args)
    make.__name__ = f"zoo.{name}"
    return make


def resnet18_cifar_blueprint(num_classes=10):
    """ResNet-18 as usually trained on CIFAR: torchvision's ResNet-18 with a 3x3 stride-1 stem and no
    maxpool (stages at 32, 16, 8, 4 pixels); the twin of ``torch_models.resnet18_cifar``."""
    from blueprint import BlockStyle, BluePrint, block, bn, conv, fc, gap, named, relu, repeat, seq
    stages = [named(f"layer{i + 1}", seq(block(width, BlockStyle.RESNET_3_3_DS if i else BlockStyle.RESNET_3_3),
                                         repeat(block(width, BlockStyle.RESNET_3_3), 1)))
              for i, width in enumerate((64, 128, 256, 512))]
    root = seq(named("conv1", conv(64, 3, 1, 1)), named("bn1", bn()), relu(), *stages, gap(),
               named("fc", fc(num_classes)))
    return BluePrint(root, "resnet18_cifar")


def without_dropout(make):
    """The blueprint of ``make`` with every dropout replaced by an identity (same parameter names).
    The CPU path and a fused CUDA plan draw different dropout masks (the seed mixes in the layer's
    index in its own plan), so the fp32 cross-check cannot run dropout; graph-vs-eager replay (one
    plan) does. (Not dropout(0.0): the CUDA path's p = 0 training forward copies without writing
    the mask its backward reads.)"""
    def build():
        from blueprint import BluePrint, Kind, identity
        from blueprint import map_layers
        bp = make()
        return BluePrint(map_layers(bp.root, lambda layer: identity() if layer.kind == Kind.DROPOUT else layer),
                         bp.name + "_nodropout")
    return build


CHECK_MODELS = (
    StepModel("resnet20", zoo_model("resnet20", 10), 32, 32,
              "He et al. CIFAR ResNet-20: CBR, BasicBlock identity + projection, GapFc"),
    StepModel("resnet50@128", zoo_model("resnet50", 10), 16, 128,
              "torchvision ResNet-50 at 128x128, 10 classes: 7x7 CBR, maxpool, Bottleneck identity + projection"),
    StepModel("mobilenet_v2@128-nodrop", without_dropout(zoo_model("mobilenet_v2", 10)), 16, 128,
              "torchvision MobileNetV2 at 128x128, 10 classes, no dropout: InvResidual (t=1, t=6, identity)"),
)
REPLAY_MODELS = (
    StepModel("resnet20", zoo_model("resnet20", 10), 32, 32, "He et al. CIFAR ResNet-20"),
    StepModel("mobilenet_v2@64", zoo_model("mobilenet_v2", 10), 16, 64,
              "torchvision MobileNetV2 at 64x64, dropout 0.2 (masks follow the device's step counter)"),
)
TIMING_MODELS = (
    StepModel("resnet18-cifar", resnet18_cifar_blueprint, 256, 32,
              "ResNet-18, CIFAR stem (3x3/1 conv, no maxpool), 10 classes", 10, "resnet18_cifar"),
    StepModel("resnet50", zoo_model("resnet50", 1000), 64, 224, "torchvision ResNet-50, 1000 classes", 1000,
              "resnet50"),
    StepModel("mobilenet_v2", zoo_model("mobilenet_v2", 1000), 64, 224,
              "torchvision MobileNetV2 (dropout 0.2), 1000 classes", 1000, "mobilenet_v2"),
    StepModel("resnet18-tv32", zoo_model("resnet18", 10), 256, 32,
              "torchvision ResNet-18 (7x7/2 stem + maxpool) at 32x32, 10 classes", 10, "resnet18", optional=True),
)
SECTION_MODELS = {"step-check": CHECK_MODELS, "step-replay": REPLAY_MODELS, "step-timing": TIMING_MODELS}
SECTION_TITLES = {
    "step-check": "whole training step at real shapes: CudaExecutor (fused AMP) vs CpuExecutor (fp32), same weights",
    "step-replay": f"graph replay vs eager replay over {REPLAY_STEPS} training steps, same weights and batches",
    "step-timing": "training-step images/s: ours (eager tape, CUDA graph) vs PyTorch eager AMP and torch.compile",
}


def step_selection(only):
    """``{section: [models]}`` that ``--only`` selects: a section by (part of) its name, or models
    by (part of) theirs; everything without ``--only``."""
    selected = {}
    for section, models in SECTION_MODELS.items():
        chosen = list(models) if not only or only in section else [m for m in models if only in m.name]
        if chosen:
            selected[section] = chosen
    return selected


def compile_step_plan(model, fuse=True, amp=True):
    from planner import ArchPlan
    from planner.compiler import Compiler
    arch = ArchPlan.from_blueprint(model.blueprint(), in_channels=3, fuse=fuse, amp=amp)
    return Compiler(arch).compile({"train": model.shape, "eval": model.shape}, optimizer_state_slots=1)


def step_batches(model, count, seed=0):
    """``count`` (x float32 NHWC, labels int64) batches of ``model``'s shape."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(model.shape, np.float32), rng.integers(0, model.classes, model.batch))
            for _ in range(count)]


def sgd():
    from blueprint.optim import SGD
    return SGD().momentum(MOMENTUM)


def relative_errors(got, want, floor=NORM_FLOOR):
    """``{name: |got - want|_2 / max(|want|_2, floor * largest |want|_2)}`` for every tensor of
    ``want`` (``got`` must have the same names); inf for a shape mismatch or a non-finite value."""
    if sorted(got) != sorted(want):
        raise KeyError(f"tensor names differ: only got {sorted(set(got) - set(want))[:5]}, "
                       f"only expected {sorted(set(want) - set(got))[:5]}")
    norms = {k: float(np.linalg.norm(np.asarray(v, np.float64))) for k, v in want.items()}
    least = floor * max(norms.values(), default=0.0)
    errors = {}
    for k, expected in want.items():
        g, w = np.asarray(got[k], np.float64), np.asarray(expected, np.float64)
        if g.shape != w.shape or not np.all(np.isfinite(g)):
            errors[k] = math.inf
            continue
        error, scale = float(np.linalg.norm(g - w)), max(norms[k], least)
        errors[k] = error / scale if scale > 0 else (0.0 if error == 0 else math.inf)
    return errors


def relative(a, b):
    a, b = float(a), float(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)


def worst(errors):
    """``(worst error, its name, median)`` of a ``relative_errors`` dict."""
    if not errors:
        return 0.0, "-", 0.0
    name = max(errors, key=lambda k: errors[k])
    return errors[name], name, float(np.median(list(errors.values())))


def train_runner(ex):
    """The ``StepRunner`` of ``ex``'s training step (recorded by its first ``train_step``)."""
    runners = [runner for (_, purpose), runner in ex._runners.items() if purpose == "train"]
    if len(runners) != 1:
        raise RuntimeError(f"expected one recorded training step in CudaExecutor._runners, found {len(runners)} "
                           f"({sorted(ex._runners)}); has the executor's bookkeeping changed?")
    return runners[0]


def release_device_memory():
    """Free what deleted executors held (numba defers deallocations) and PyTorch's cached blocks."""
    import gc
    gc.collect()
    try:
        cuda.current_context().deallocations.clear()
    except Exception as error:   # not fatal: only the memory stays held longer
        if not getattr(release_device_memory, "warned", False):
            print(f"    (could not flush numba's deferred deallocations: {error}; memory is freed later)")
            release_device_memory.warned = True
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def report_crash(what, error, problems):
    """Print the traceback of a failed unit and record it; the run goes on with the next unit."""
    import traceback
    print(f"  {what}: CRASHED: {type(error).__name__}: {error}")
    traceback.print_exc(file=sys.stdout)
    problems.append(f"{what}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
