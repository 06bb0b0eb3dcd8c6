"""`blueprint train`'s workflow flags: each maps to the configuration value it names, an image
folder trains end to end with early stopping and best checkpoints, and the messages read right."""
import json

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from blueprint.cli import build_parser, main  # noqa: E402
from blueprint._train_command import build_task, load_data  # noqa: E402
from blueprint._train_options import DataOptions  # noqa: E402
from blueprint.optim import Adam, OneCycleLR, ReduceLROnPlateau, StepLR  # noqa: E402
from blueprint.task import EarlyStopping, ModelCheckpoint  # noqa: E402
from blueprint.task.data import Augment, digits  # noqa: E402


def _args(*flags):
    return build_parser().parse_args(["train", *flags])


def test_each_flag_sets_the_value_it_names():
    train, val = digits()
    task = build_task(_args("--optimizer", "adam", "--schedule", "onecycle", "--label-smoothing", "0.1",
                            "--augment", "crop=2,flip", "--early-stopping", "3", "--keep-best", "2"),
                      train, val, "digits")
    assert task.optimizer_config == Adam(lr=1e-3)
    assert task.scheduler_config == OneCycleLR()
    assert task.loss_config.smoothing == 0.1
    assert task.augmentation == Augment(crop_padding=2, hflip=True)
    assert task.callbacks == (EarlyStopping("val_loss", patience=3), ModelCheckpoint("val_loss", keep=2))
    other = build_task(_args("--schedule", "step", "--epochs", "9", "--augment", "none"), train, val, "cifar10")
    assert other.scheduler_config == StepLR(step_size=3) and other.augmentation is None
    assert build_task(_args("--schedule", "plateau"), train, val, "digits").scheduler_config == \
        ReduceLROnPlateau(patience=2)


@pytest.mark.parametrize("flags, fragment", [
    (["--augment", "rotate"], "expected none, flip, crop=N"),
    (["--label-smoothing", "1.5"], "expected a number in [0, 1)"),
    (["--optimizer", "rmsprop"], "invalid choice"),
])
def test_bad_flag_values_are_usage_errors(capsys, flags, fragment):
    assert main(["train", *flags]) == 2
    assert fragment in capsys.readouterr().err


def test_val_fraction_splits_digits_and_is_refused_where_the_set_is_given():
    train, val, _ = load_data("digits", DataOptions(val_fraction=0.5))
    assert abs(len(train) - len(val)) <= 10
    assert main(["train", "--data", "synthetic", "--val-fraction", "0.3"]) == 2


def _folder(root, per_class=6):
    for label, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(np.array(colour) + np.random.default_rng(i).integers(-20, 20, (12, 10, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(root / f"class{label}" / f"{i}.png")
    return root


def test_an_image_folder_trains_with_early_stopping_and_best_checkpoints(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BLUEPRINT_CACHE", str(tmp_path / "cache"))
    data = _folder(tmp_path / "photos")
    out = tmp_path / "run"
    code = main(["train", "--data", f"folder:{data}", "--image-size", "8", "--epochs", "6", "--batch-size", "64",
                 "--early-stopping", "1", "--keep-best", "2", "--val-fraction", "0.34", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert "warning: --batch-size 64 is larger than the 12 training samples" in captured.err
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert result["epochs"] == len(history) and result["stopped_early"] == (len(history) < 6)
    best = sorted(p.name for p in out.glob("best-epoch*.safetensors"))
    ranked = sorted(history, key=lambda r: (r["val_loss"], r["epoch"]))[:2]
    assert best == sorted(f"best-epoch{r['epoch']:03d}.safetensors" for r in ranked)


def test_one_epoch_reads_one_epoch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BLUEPRINT_CACHE", str(tmp_path / "cache"))
    data = _folder(tmp_path / "photos", per_class=3)
    assert main(["train", "--data", f"folder:{data}", "--image-size", "8", "--epochs", "1", "--batch-size", "4",
                 "--quiet", "--out", str(tmp_path / "run")]) == 0
    assert ": 1 epoch in " in capsys.readouterr().out
