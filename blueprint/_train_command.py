"""`blueprint train`: train a zoo model (or a BluePrint from a file) on a dataset.

With no arguments it runs the default demo: the zoo's small CNN on the bundled UCI digits,
on the CPU. The run locks OUT (one run per folder). Every epoch appends a line tagged with the
run's id to `OUT/history.jsonl` and rewrites `OUT/checkpoint.safetensors` (atomically); at the
end `OUT/curves.png` plots loss and accuracy (if matplotlib is installed). Ctrl-C stops at the
next step boundary, saves the exact position to `OUT/checkpoint.interrupted.safetensors` (the
epoch checkpoint is kept) and exits with status 130; `--resume` that file to continue.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from blueprint import zoo
from blueprint._launch import add_launch_arguments, in_torchrun_worker, launch_workers
from blueprint._model_source import CliError, load_model
from blueprint._run_folder import append_history, keep_earlier, new_run_id, restore_history, run_folder
from blueprint._train_options import (DEFAULT_VAL_FRACTION, OPTIMIZERS, SCHEDULE_CHOICES, DataOptions,
                                      add_training_arguments, augment_for, callbacks_for, data_options, optimizer_for,
                                      plural)
from blueprint.optim import CrossEntropyLoss
from blueprint.task import DeepLearningTask
from blueprint.task._position import Terminated, interrupt_path
from blueprint.task.data import cifar10, digits, image_folder, synthetic, validation_split

DEFAULTS = {"model": "small_cnn", "data": "digits", "epochs": 8, "batch_size": 32, "seed": 0}
CHECKPOINT_NAME = "checkpoint.safetensors"
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143   # 128 + SIGINT, 128 + SIGTERM, as a shell reports them
SYNTHETIC_SIZES = (2048, 512)   # train, val: two draws from one synthetic distribution
OUTPUT_HELP = ("Progress goes to stderr: a bar per batch on a terminal, one line per epoch (train and "
               "validation loss/accuracy, time, img/s, lr) anywhere else; the result goes to stdout.")
FOLDER_SPLITS = ("train", "val")   # folder:PATH with these two subfolders is already split


def add_train_command(subparsers) -> None:
    command = subparsers.add_parser("train", help="train a model (default: small_cnn on the bundled digits)",
                                    description=__doc__.split("\n\n")[0] + " " + OUTPUT_HELP)
    command.add_argument("--model", default=DEFAULTS["model"],
                         help="zoo name (blueprint models lists them) or path/to/file.py:attr (default %(default)s)")
    command.add_argument("--data", default=DEFAULTS["data"],
                         help="digits (bundled), cifar10:PATH (the binary CIFAR-10 files), folder:PATH (one "
                              "subfolder of JPEG/PNG images per class, or train/ and val/ folders of those; needs "
                              "Pillow) or synthetic (default %(default)s)")
    command.add_argument("--epochs", type=int, default=DEFAULTS["epochs"],
                         help="total epochs, counted from the start of the run (default %(default)s)")
    command.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"],
                         help="training batch size (default %(default)s; evaluation uses 256)")
    command.add_argument("--lr", type=float, default=None,
                         help="peak learning rate of the schedule (default "
                              + ", ".join(f"{lr} {name}" for name, (_, lr) in OPTIMIZERS.items()) + ")")
    command.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="sgd",
                         help="sgd (momentum 0.9, nesterov, weight decay 5e-4), adam or adamw (weight decay 0.05) "
                              "(default %(default)s)")
    command.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                         help="cpu: the fp32 reference path; cuda: fp16 fused kernels (default %(default)s)")
    command.add_argument("--seed", type=int, default=DEFAULTS["seed"],
                         help="seeds initialisation, data order, augmentation and dropout (default %(default)s)")
    command.add_argument("--out", default=None,
                         help="run folder for checkpoint.safetensors, history.jsonl and curves.png "
                              "(default runs/MODEL-DATA)")
    command.add_argument("--resume", default=None,
                         help="a checkpoint to continue from, e.g. OUT/checkpoint.interrupted.safetensors "
                              "(default: start afresh)")
    command.add_argument("--json", action="store_true",
                         help="print only the final metrics, as one JSON object on stdout (no progress)")
    command.add_argument("--quiet", action="store_true",
                         help="no progress bar, compile notice or per-epoch lines; only the final result")
    add_training_arguments(command)
    add_launch_arguments(command)
    command.set_defaults(run=run_train, train_command=command)


def load_data(spec: str, options: DataOptions = DataOptions()):
    """(train, val, dataset name) for a --data value."""
    fraction = DEFAULT_VAL_FRACTION if options.val_fraction is None else options.val_fraction
    if options.val_fraction is not None and not (spec == "digits" or spec.startswith("folder:")):
        raise CliError(f"--val-fraction applies to digits and folder:PATH; {spec} comes with its own validation set")
    if spec == "digits":
        train, val = digits(fraction)
        return train, val, "digits"
    if spec.startswith("folder:") and spec != "folder:":
        return (*_folder(Path(spec.split(":", 1)[1]), options.image_size, fraction), "folder")
    if spec == "synthetic":
        train_size, val_size = SYNTHETIC_SIZES
        return synthetic(train_size, seed=0, draw=0), synthetic(val_size, seed=0, draw=1), "synthetic"
    if spec.startswith("cifar10:") and spec != "cifar10:":
        train, test = cifar10(spec.split(":", 1)[1])
        return train, test, "cifar10"
    fix = "; name the folder of the binary CIFAR-10 files after the colon" if spec.startswith("cifar10") else ""
    raise CliError(f"--data: expected digits, synthetic, cifar10:PATH or folder:PATH, got {spec!r}{fix}")


def _folder(root: Path, size: int, fraction: float):
    """(train, val) of an image folder: its train/ and val/ subfolders, or a stratified split of it."""
    if all((root / split).is_dir() for split in FOLDER_SPLITS):
        train, val = (image_folder(root / split, size) for split in FOLDER_SPLITS)
        if train.classes != val.classes:
            raise CliError(f"--data folder:{root}: train/ has classes {list(train.classes)} but val/ has "
                           f"{list(val.classes)}; give both the same class subfolders")
        return train, val
    if fraction <= 0:
        raise CliError(f"--data folder:{root} has no train/ and val/ subfolders, so --val-fraction must be > 0")
    return validation_split(image_folder(root, size), fraction)


def build_task(args, train, val, data_name: str) -> DeepLearningTask:
    if args.epochs < 1 or args.batch_size < 1:
        raise CliError(f"--epochs and --batch-size must be positive, got {args.epochs} and {args.batch_size}")
    if args.model in zoo.MODELS:
        bp = zoo.MODELS[args.model].build(num_classes=max(train.num_classes, val.num_classes)) \
            if args.model != "mlp" else zoo.mlp([_features(train)] + [256, 128, max(train.num_classes, val.num_classes)])
    else:
        bp, _ = load_model(args.model, train.sample_shape)
    if args.batch_size > len(train):
        print(f"warning: --batch-size {args.batch_size} is larger than the {len(train)} training samples, so every "
              f"epoch is a single step of {len(train)}; pass a smaller --batch-size "
              f"(e.g. {_suggested_batch(len(train))})",
              file=sys.stderr)
    task = (DeepLearningTask().model(bp).loss(CrossEntropyLoss().label_smoothing(args.label_smoothing))
            .optimizer(optimizer_for(args)).scheduler(SCHEDULE_CHOICES[args.schedule](args.epochs))
            .data(train=train, val=val, batch_size=args.batch_size, eval_batch_size=256,
                  augment=augment_for(args, data_name))
            .epochs(args.epochs).device(args.device).seed(args.seed).progress(not (args.json or args.quiet)))
    for callback in callbacks_for(args):
        task = task.callback(callback)
    return task


def _suggested_batch(samples: int) -> int:
    """A power of two giving at least ten steps per epoch."""
    return max(1, 2 ** max(0, (samples // 10).bit_length() - 1))


def _features(dataset) -> int:
    h, w, c = dataset.sample_shape
    return h * w * c


def run_train(args) -> int:
    if args.nproc_per_node is not None and not in_torchrun_worker():
        return launch_workers(args.train_command, args)
    if args.device == "cuda":
        if in_torchrun_worker():   # this worker's GPU (LOCAL_RANK) becomes current before any CUDA call
            from cuda_kernels.collective import select_local_device
            select_local_device()
        _check_cuda()
    train, val, data_name = load_data(args.data, data_options(args))
    task = build_task(args, train, val, data_name)   # every argument checked before the folder is touched
    if in_torchrun_worker():   # one data-parallel replica; rank 0 alone writes the run folder and prints
        task = task.distributed(sync_batchnorm=args.sync_batchnorm, timeout_s=args.timeout)
        if not task.distributed_config.is_writer:
            if args.resume:
                task = task.resume(args.resume)
            task.fit()
            return 0
    elif args.sync_batchnorm:
        raise CliError("--sync-batchnorm applies to data-parallel runs: add --nproc-per-node N, or launch with "
                       "torchrun --nproc-per-node N -m blueprint train ...")
    out = Path(args.out or f"runs/{Path(args.model.split(':')[0]).stem}-{data_name}")
    checkpoint = out / CHECKPOINT_NAME
    run_id = new_run_id()
    kept = []
    with run_folder(out):
        saved = interrupt_path(checkpoint)
        earlier = _modified(saved)             # an interrupt file of an earlier run is not this run's
        try:
            with keep_earlier([] if args.resume else [checkpoint, saved]) as kept:
                history, seconds = _fit(task, args, out, checkpoint, run_id)
        except KeyboardInterrupt as stop:
            _say_interrupted(checkpoint, saved, earlier)
            return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED
        finally:
            _say_kept(kept, args)
        plot = _plot(history, out / "curves.png")
    last = history[-1]
    train_seconds = sum(len(train) / r.images_per_second for r in history)
    metrics = {"val_accuracy": last.val_accuracy, "val_loss": last.val_loss, "epochs": last.epoch,
               "seconds": round(seconds, 3), "images_per_second": round(len(train) * len(history) / train_seconds, 1),
               "checkpoint": str(checkpoint), "run": run_id, "kept": [str(k) for k in kept],
               "stopped_early": last.epoch < args.epochs}
    if args.json:
        print(json.dumps(metrics, allow_nan=False))   # strict JSON: a NaN metric is a failed run, never printed
    else:
        early = " (stopped early)" if last.epoch < args.epochs else ""
        print(f"trained {task.blueprint_value.name or args.model} on {data_name}: {plural(last.epoch, 'epoch')}{early} "
              f"in {seconds:.1f} s, "
              f"val accuracy {last.val_accuracy:.4f}, val loss {last.val_loss:.4f}")
        print(f"checkpoint {checkpoint}, history {out / 'history.jsonl'} (run {run_id})"
              + (f", plot {plot}" if plot else ""))
    if plot is None and not (args.quiet or args.json):
        print("notice: matplotlib is not installed, so no curves.png was drawn "
              "(pip install \".[examples]\" in the blueprint-nn source tree)", file=sys.stderr)
    return 0


def _fit(task, args, out, checkpoint, run_id):
    """Train into the locked run folder: (history, seconds)."""
    task = task.checkpoint(checkpoint).callback(lambda record: append_history(out, run_id, record.as_dict()))
    start = time.perf_counter()
    if args.resume:
        task = task.resume(args.resume)
        _check_epochs_left(task, args)
        restore_history(out, run_id, [record.as_dict() for record in task.session().history])
    history = task.fit()
    return history, time.perf_counter() - start


def _say_interrupted(checkpoint, saved, earlier) -> None:
    """After Ctrl-C: where the position was saved, or that none was (``earlier``: the interrupt file's
    modification time before this run, so an earlier run's file is not taken for this run's)."""
    if _modified(saved) not in (None, earlier):
        print(f"\ninterrupted: position saved to {saved} (continue with --resume {saved}); "
              f"{checkpoint.name} keeps the last finished epoch", file=sys.stderr)
    else:
        resume = f"; continue from the last finished epoch with --resume {checkpoint}" if checkpoint.exists() else ""
        print("\ninterrupted: no position was saved (stopped before the first step, or inside a step by a "
              f"second Ctrl-C){resume}", file=sys.stderr)


def _say_kept(kept, args) -> None:
    """Name the earlier run's checkpoints this run replaced, kept under their second names."""
    if kept and not args.json:
        print("this run replaced an earlier run's checkpoint; the earlier one is kept as "
              + ", ".join(str(k) for k in kept), file=sys.stderr)


def _check_epochs_left(task, args) -> None:
    """`--epochs` is the total: resuming a checkpoint that has done as many trains nothing, so say so."""
    done = task.session().epochs_done
    if args.epochs <= done:
        raise CliError(f"--resume {args.resume} has done {done} epochs and --epochs {args.epochs} is the total, "
                       f"counted from the start of the run, so there is nothing to train; pass --epochs {done + 1} "
                       "or more")


def _check_cuda() -> None:
    """Refuse `--device cuda` before any work where the CUDA kernels cannot run, with the CLI's fix."""
    try:
        from cuda_kernels import cuda_unavailable_reason
    except ImportError as error:
        fix = "" if '".[cuda]"' in str(error) else "; pip install \".[cuda]\" in the blueprint-nn source tree"
        raise CliError(f"--device cuda needs numba-cuda ({error}){fix}, or train on the CPU with --device cpu") \
            from error
    why = cuda_unavailable_reason()
    if why:
        raise CliError(f"--device cuda: {why.split(';')[0]}; train on the CPU with --device cpu (or set "
                       f"NUMBA_ENABLE_CUDASIM=1 to run the CUDA kernels in numba's simulator, slowly)")
def _modified(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _plot(history, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    epochs = [r.epoch for r in history]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(9, 3.5))
    loss_ax.plot(epochs, [r.train_loss for r in history], label="train")
    loss_ax.plot(epochs, [r.val_loss for r in history], label="val")
    loss_ax.set_xlabel("epoch"), loss_ax.set_ylabel("loss"), loss_ax.legend()
    acc_ax.plot(epochs, [r.train_accuracy for r in history], label="train")
    acc_ax.plot(epochs, [r.val_accuracy for r in history], label="val")
    acc_ax.set_xlabel("epoch"), acc_ax.set_ylabel("accuracy"), acc_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
