"""DeepLearningTask: immutable configuration, validation before work, determinism, exact resume,
checkpoints, the end-to-end fit on the real digits, and `blueprint train --json`."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from blueprint import BluePrint, fc, gap, seq, cbr, zoo
from blueprint.optim import SGD, AdamW, CosineAnnealingLR, StepLR
from blueprint.task import ConfigError, DeepLearningTask
from blueprint.task.data import ArrayDataset, Augment, digits


@pytest.fixture(scope="module")
def digit_sets():
    return digits()


def tiny_model(classes=10):
    return BluePrint(seq(cbr(8, 3, 1, 1), gap(), fc(classes)))


def base_task(digit_sets, **data):
    train, val = digit_sets
    return (DeepLearningTask().model(tiny_model()).optimizer(SGD().lr(0.1).momentum(0.9))
            .data(train=ArrayDataset(train.x[:300], train.y[:300]), val=ArrayDataset(val.x[:100], val.y[:100]),
                  batch_size=64, **data)
            .epochs(2).seed(0).progress(False))


def test_setters_return_new_values_and_leave_the_original_alone(digit_sets):
    task = base_task(digit_sets)
    other = task.epochs(5).seed(3).optimizer(AdamW())
    assert (task.epoch_count, task.seed_value, type(task.optimizer_config)) == (2, 0, SGD)
    assert (other.epoch_count, other.seed_value, type(other.optimizer_config)) == (5, 3, AdamW)
    with pytest.raises(AttributeError):
        task.epoch_count = 9


BAD_CONFIGS = [
    ("no model", lambda t: DeepLearningTask().data(train=t.train_set), ConfigError, "no model"),
    ("no data", lambda t: DeepLearningTask().model(tiny_model()), ConfigError, "no training data"),
    ("batch size 0", lambda t: t.data(train=t.train_set, batch_size=0), ConfigError, "positive int"),
    ("negative epochs", lambda t: t.epochs(-1), ConfigError, "positive int"),
    ("model not a BluePrint", lambda t: t.model(seq(fc(3))), TypeError, "expected a BluePrint"),
    ("too few logits", lambda t: t.model(tiny_model(classes=3)), ConfigError, "has 10 classes but the model outputs 3"),
    ("val shape differs", lambda t: t.data(train=t.train_set, val=ArrayDataset(np.zeros((4, 9, 9, 1), np.uint8),
                                                                                  np.zeros(4, np.int64))),
     ConfigError, "both sets must have one shape"),
    ("amp on cpu", lambda t: t.amp(True), ConfigError, "fp32 unfused reference"),
    ("fuse without amp", lambda t: t.device("cuda").amp(False), ConfigError, "needs amp(True)"),
    ("unknown device", lambda t: t.device("tpu"), ConfigError, "expected one of"),
    ("nesterov without momentum", lambda t: t.optimizer(SGD().nesterov(True)), ValueError, "nesterov"),
    ("model that ends 4-D", lambda t: t.model(BluePrint(seq(cbr(8, 3, 1, 1)))), ValueError, "must end with (N, classes)"),
    ("input too small for the model", lambda t: t.model(zoo.vgg11_bn(10)), ValueError, "needs a spatial size"),
]


@pytest.mark.parametrize("what, configure, error, fragment", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_configurations_fail_before_any_work(digit_sets, what, configure, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        configure(base_task(digit_sets)).fit()


def test_cuda_without_a_gpu_is_a_clear_error_not_a_cpu_run(digit_sets):
    with pytest.raises(RuntimeError, match="GPU"):
        base_task(digit_sets).device("cuda").fit()


def test_compiles_exactly_the_variants_it_needs(digit_sets):
    task = base_task(digit_sets)          # 300 train (64 x 4 + 44), 100 val (64 + 36)
    variants = {name: v.input_shape for name, v in task.session().plan.variants.items()}
    assert variants == {"train": (64, 8, 8, 1), "train_last": (44, 8, 8, 1), "eval": (64, 8, 8, 1),
                        "eval_last": (36, 8, 8, 1)}
    assert "train_last" not in {n for n in base_task(digit_sets).drop_last().session().plan.variants}


def test_same_seed_gives_bit_identical_history(digit_sets):
    a = base_task(digit_sets, augment=Augment(crop_padding=1)).fit()
    b = base_task(digit_sets, augment=Augment(crop_padding=1)).fit()
    assert [r.metrics() for r in a] == [r.metrics() for r in b]
    c = base_task(digit_sets, augment=Augment(crop_padding=1)).seed(1).fit()
    assert [r.metrics() for r in a] != [r.metrics() for r in c]


def test_interrupt_then_resume_is_exact(digit_sets, tmp_path):
    """3 epochs straight == 2 epochs, Ctrl-C, resume for the last epoch: bit for bit."""
    schedule = CosineAnnealingLR().warmup(1)
    straight = base_task(digit_sets).scheduler(schedule).epochs(3)
    straight.fit()

    def interrupt_after_two(record):
        if record.epoch == 2:
            raise KeyboardInterrupt

    checkpoint = tmp_path / "ckpt.safetensors"
    interrupted = base_task(digit_sets).scheduler(schedule).epochs(3).checkpoint(checkpoint).callback(interrupt_after_two)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = base_task(digit_sets).scheduler(schedule).epochs(3).resume(checkpoint)
    history = resumed.fit()
    assert [r.epoch for r in history] == [1, 2, 3]
    a, b = straight.session().executor.state_dict(), resumed.session().executor.state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a), "weights differ after resume"
    a, b = straight.session().executor.optimizer_state(), resumed.session().executor.optimizer_state()
    assert all(np.array_equal(a[k], b[k]) for k in a), "optimizer state differs after resume"
    assert [r.metrics() for r in straight.history] == [r.metrics() for r in history]


def test_checkpoint_for_another_model_names_the_problem(digit_sets, tmp_path):
    task = base_task(digit_sets).epochs(1)
    task.fit()
    task.save(tmp_path / "a.safetensors")
    other = base_task(digit_sets).model(BluePrint(seq(cbr(16, 3, 1, 1), gap(), fc(10))))
    with pytest.raises(ConfigError, match="different model"):
        other.resume(tmp_path / "a.safetensors")
    loaded = DeepLearningTask.load(tmp_path / "a.safetensors")
    assert loaded.blueprint_value == task.blueprint_value and loaded.optimizer_config == task.optimizer_config
    # the weights themselves: loading them into a different network names the keys
    with pytest.raises(KeyError, match="0.0.weight: expected"):
        other.session().executor.load_state_dict(task.session().executor.state_dict())


def test_log_and_callback_see_every_epoch(digit_sets, tmp_path):
    seen = []
    log = tmp_path / "history.jsonl"
    base_task(digit_sets).epochs(2).log(log).callback(seen.append).fit()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2] == [r.epoch for r in seen]
    assert set(lines[0]) >= {"train_loss", "val_accuracy", "lr", "seconds", "images_per_second"}


def test_fit_on_digits_learns(digit_sets):
    train, val = digit_sets
    task = (DeepLearningTask().model(zoo.small_cnn()).optimizer(SGD().lr(0.05).momentum(0.9).nesterov(True))
            .scheduler(StepLR().step_size(2).gamma(0.5)).data(train=train, val=val, batch_size=64)
            .epochs(3).progress(False))
    history = task.fit()
    assert history[-1].val_accuracy > 0.8          # chance is 0.1
    metrics = task.evaluate(val)
    assert metrics["top1"] == pytest.approx(history[-1].val_accuracy)
    assert metrics["top5"] >= metrics["top1"] and metrics["samples"] == len(val)
    assert task.logits(np.zeros((3, 8, 8, 1), np.uint8)).shape == (3, 10)


def test_cli_train_json(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, "-m", "blueprint", "train", "--epochs", "3", "--batch-size", "64",
                             "--out", str(tmp_path / "run"), "--json"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(metrics) >= {"val_accuracy", "val_loss", "epochs", "seconds", "images_per_second"}
    assert metrics["epochs"] == 3 and metrics["val_accuracy"] > 0.5      # chance is 0.1
    assert (tmp_path / "run" / "checkpoint.safetensors").exists()
    assert len((tmp_path / "run" / "history.jsonl").read_text().splitlines()) == 3


def test_default_demo_reaches_the_accuracy_readme_promises(tmp_path, capsys):
    """`blueprint train` with no arguments (README's first command): >= 97% on the digits."""
    from blueprint.cli import main
    from blueprint._train_command import DEFAULTS

    assert main(["train", "--json", "--out", str(tmp_path / "demo")]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["epochs"] == DEFAULTS["epochs"] and metrics["val_accuracy"] >= 0.97
