"""`blueprint predict` and `blueprint export`: a trained checkpoint used from scripts.

    blueprint predict runs/small_cnn-digits/checkpoint.safetensors images.npy --top-k 3 [--json]
    blueprint export runs/small_cnn-digits/checkpoint.safetensors --onnx small_cnn.onnx [--batch 8]

`predict` reads a ``.npy`` array (never a pickle) of raw samples as in the training set: NHWC,
the training data's dtype (uint8 images too), one sample (H, W, C) or a batch (N, H, W, C); the
model normalises them with the statistics stored in the checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from blueprint._model import DEFAULT_BATCH, Model
from blueprint._model_source import CliError

DEFAULT_TOP_K = 5


def add_predict_command(subparsers) -> None:
    command = subparsers.add_parser("predict", help="classify the samples of a .npy file with a checkpoint",
                                    description=__doc__.split("\n\n")[2])
    command.add_argument("checkpoint", help="a checkpoint written by training (checkpoint.safetensors)")
    command.add_argument("input", help="a .npy array: (N, H, W, C) or one (H, W, C) sample, raw as in training")
    command.add_argument("--top-k", type=int, default=DEFAULT_TOP_K,
                         help=f"classes listed per sample, most probable first (default {DEFAULT_TOP_K})")
    command.add_argument("--batch-size", type=int, default=DEFAULT_BATCH,
                         help=f"samples per forward pass (default {DEFAULT_BATCH})")
    command.add_argument("--json", action="store_true",
                         help="print a JSON list: per sample its top-k classes and probabilities")
    command.set_defaults(run=run_predict)


def add_export_command(subparsers) -> None:
    command = subparsers.add_parser("export", help="export a checkpoint's eval graph (ONNX)",
                                    description="Write the eval graph of a checkpoint as an ONNX model: input "
                                                "'input' float32 NCHW, normalised; output 'logits'; opset 17.")
    command.add_argument("checkpoint", help="a checkpoint written by training (checkpoint.safetensors)")
    command.add_argument("--onnx", required=True, metavar="OUT", help="the .onnx file to write")
    command.add_argument("--batch", type=int, default=None, help="a fixed batch size (default: a dynamic batch axis)")
    command.set_defaults(run=run_export)


def run_predict(args) -> int:
    if args.top_k < 1:
        raise CliError(f"--top-k must be >= 1, got {args.top_k}")
    model = Model.load(args.checkpoint)
    x = _read_npy(Path(args.input))
    if x.shape == model.spec.sample_shape:
        x = x[None]
    probabilities = model.probabilities(x, batch_size=args.batch_size)
    k = min(args.top_k, model.classes)
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    rows = [{"index": i, "top_k": [{"class": int(c), "probability": float(probabilities[i, c])} for c in ranked]}
            for i, ranked in enumerate(order)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['index']}: " + ", ".join(f"{e['class']} ({e['probability']:.3f})" for e in row["top_k"]))
    return 0


def run_export(args) -> int:
    if Path(args.onnx).is_dir():
        raise CliError(f"--onnx {args.onnx} is a folder; name the file to write, e.g. {Path(args.onnx) / 'model.onnx'}")
    model = Model.load(args.checkpoint)
    try:
        path = model.export_onnx(args.onnx, batch=args.batch)
    except ImportError as error:    # the onnx package is an optional extra
        raise CliError(str(error)) from error
    spec = model.spec
    n = "N" if args.batch is None else args.batch
    print(f"wrote {path}: input 'input' float32 NCHW ({n}, {spec.sample_shape[2]}, {spec.sample_shape[0]}, "
          f"{spec.sample_shape[1]}), normalised with mean {spec.mean} std {spec.std}"
          f"{' after /255' if spec.dtype == 'uint8' else ''}; output 'logits' ({n}, {model.classes})")
    return 0


def _read_npy(path: Path) -> np.ndarray:
    if path.exists() and not path.is_file():
        raise CliError(f"input {path} is not a regular file (a folder, pipe or device); save the samples with "
                       "np.save(path, x) and pass that file")
    if not path.is_file():
        raise FileNotFoundError(f"input {path} does not exist; save the samples with np.save(path, x)")
    try:
        x = np.load(path, allow_pickle=False)   # never unpickle a file
        if not isinstance(x, np.ndarray):
            raise ValueError(f"it holds {type(x).__name__}, not one array")
        return x
    except (ValueError, EOFError) as error:   # also a pickled (object) array, an .npz, a header that lies
        why = " ".join(str(error).split())[:200]
        raise CliError(f"{path}: not a .npy file of numbers ({why}); save the samples with np.save(path, x) where x "
                       "is a numeric array") from error
