"""The training choices of `blueprint train`, as tables: optimizer, schedule, augmentation, label
smoothing, validation fraction, image size, early stopping and best checkpoints; each flag maps
to one configuration value of the Python API."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from blueprint.optim import SGD, Adam, AdamW, ConstantLR, CosineAnnealingLR, OneCycleLR, ReduceLROnPlateau, StepLR
from blueprint.task import EarlyStopping, ModelCheckpoint
from blueprint.task.data import Augment

#: --optimizer NAME -> (the configuration without its lr, the default lr)
OPTIMIZERS = {
    "sgd": (lambda: SGD().momentum(0.9).nesterov(True).weight_decay(5e-4), 0.05),
    "adam": (lambda: Adam(), 1e-3),
    "adamw": (lambda: AdamW().weight_decay(0.05), 2e-3),
}
STEP_DECAYS = 3   # --schedule step: the lr drops 10x at each third of the epochs
#: --schedule NAME -> the schedule for a run of `epochs` epochs (each takes the optimizer's lr as its peak)
SCHEDULE_CHOICES = {
    "cosine": lambda epochs: CosineAnnealingLR().warmup(1),
    "onecycle": lambda epochs: OneCycleLR(),
    "step": lambda epochs: StepLR().step_size(max(1, epochs // STEP_DECAYS)),
    "plateau": lambda epochs: ReduceLROnPlateau(patience=2),
    "constant": lambda epochs: ConstantLR(),
}
SCHEDULE_HELP = ("cosine (one warmup epoch, then cosine annealing), onecycle (torch's OneCycleLR), step (10x lower "
                 "at each third of the epochs), plateau (10x lower after 2 epochs without a better val_loss), constant")
DEFAULT_LABEL_SMOOTHING = 0.05
DEFAULT_IMAGE_SIZE = 32
DEFAULT_VAL_FRACTION = 0.2
#: the augmentation each --data source gets unless --augment says otherwise
DEFAULT_AUGMENT = {"digits": "none", "cifar10": "crop=4,flip", "synthetic": "none", "folder": "flip"}


@dataclass(frozen=True)
class DataOptions:
    """How --data is read: the validation fraction (None: the source's default) and the image size."""

    val_fraction: float | None = None
    image_size: int = DEFAULT_IMAGE_SIZE


def add_training_arguments(command) -> None:
    command.add_argument("--schedule", choices=tuple(SCHEDULE_CHOICES), default="cosine",
                         help=SCHEDULE_HELP + " (default %(default)s)")
    command.add_argument("--label-smoothing", type=_fraction, default=DEFAULT_LABEL_SMOOTHING, metavar="X",
                         help="cross-entropy label smoothing, 0 <= X < 1 (default %(default)s)")
    command.add_argument("--augment", type=augment_value, default=None, metavar="SPEC",
                         help="none, flip, crop=N (random crop with N pixels of padding) or both as crop=4,flip "
                              "(default: crop=4,flip for cifar10, flip for folder:, none otherwise)")
    command.add_argument("--val-fraction", type=_fraction, default=None, metavar="X",
                         help="the share of the training images held out for validation (digits, and folder: "
                              f"without train/ and val/ subfolders; default {DEFAULT_VAL_FRACTION})")
    command.add_argument("--image-size", type=int, default=DEFAULT_IMAGE_SIZE, metavar="S",
                         help="folder: images are scaled and centre-cropped to S x S (default %(default)s)")
    command.add_argument("--early-stopping", type=int, default=None, metavar="PATIENCE",
                         help="stop when val_loss has not improved for PATIENCE epochs")
    command.add_argument("--keep-best", type=int, nargs="?", const=1, default=None, metavar="N",
                         help="keep the N best checkpoints by val_loss in the run folder as best-epochNNN.safetensors "
                              "(N defaults to 1)")


def augment_value(text: str) -> Augment:
    """`none`, `flip`, `crop=N`, or a comma-separated combination, as an Augment (`Augment()` for none)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts == ["none"]:
        return Augment()
    padding, flip = 0, False
    for part in parts:
        if part == "flip":
            flip = True
        elif part.startswith("crop=") and part[5:].isdigit() and int(part[5:]) > 0:
            padding = int(part[5:])
        else:
            raise argparse.ArgumentTypeError(f"expected none, flip, crop=N or crop=N,flip; got {text!r}")
    if not parts:
        raise argparse.ArgumentTypeError(f"expected none, flip, crop=N or crop=N,flip; got {text!r}")
    return Augment(crop_padding=padding, hflip=flip)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def data_options(args) -> DataOptions:
    if args.image_size < 1:
        raise argparse.ArgumentTypeError(f"--image-size must be positive, got {args.image_size}")
    return DataOptions(args.val_fraction, args.image_size)


def optimizer_for(args):
    make, default_lr = OPTIMIZERS[args.optimizer]
    return make().lr(args.lr if args.lr is not None else default_lr)


def augment_for(args, data_name: str) -> Augment | None:
    chosen = args.augment if args.augment is not None else augment_value(DEFAULT_AUGMENT[data_name])
    return None if chosen == Augment() else chosen


def callbacks_for(args) -> tuple:
    callbacks = []
    if args.early_stopping is not None:
        callbacks.append(EarlyStopping("val_loss", patience=args.early_stopping))
    if args.keep_best is not None:
        callbacks.append(ModelCheckpoint("val_loss", keep=args.keep_best))
    return tuple(callbacks)


def plural(count: int, word: str) -> str:
    """`1 epoch`, `3 epochs`."""
    return f"{count} {word}{'' if count == 1 else 's'}"
