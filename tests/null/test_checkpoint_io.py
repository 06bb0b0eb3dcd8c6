"""Checkpoint files: exact round trip of tensors and state, atomic replacement, clear errors."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from blueprint.task import _checkpoint
from blueprint.task import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TENSORS = {
    "model.conv1.weight": np.arange(2 * 3 * 3 * 4, dtype=np.float32).reshape(2, 3, 3, 4) / 7,
    "model.fc.bias": np.array([1.5, -2.25], np.float32),
    "model.bn.num_batches_tracked": np.array(12, np.int64),
    "optim.momentum": np.linspace(-1, 1, 9, dtype=np.float32),
    "optim.half": np.array([0.1, 65504.0], np.float16),
    "mask": np.array([True, False, True]),
    "empty": np.zeros((0, 5), np.float32),
    "strided": np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2],
}


def _generator_state(seed):
    return np.random.Generator(np.random.PCG64(seed)).bit_generator.state


STATE = {
    "epoch": 7,
    "step": 2**40,
    "optimizer": "SGD().lr(0.1).momentum(0.9)",
    "lr": 0.0123456789012345,
    "best": float("inf"),
    "loss": float("nan"),
    "done": False,
    "note": None,
    "rng": _generator_state(2**64 + 5),
    "history": [{"epoch": 0, "loss": 2.3}, {"epoch": 1, "loss": 1.9}],
    "shape": (3, 4),
    "numpy_scalars": [np.float32(0.5), np.int64(-3), np.bool_(True)],
    "arrays": {"f32": np.array([[1.0, np.nan], [np.inf, -0.0]], np.float32),
               "u64": np.array([2**64 - 1, 0], np.uint64), "scalar": np.array(3, np.int8)},
}


def _assert_same(a, b):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, float) and np.isnan(a):
        assert isinstance(b, float) and np.isnan(b)
    elif isinstance(a, np.generic):
        assert b == a.item() and type(b) is type(a.item())
    else:
        assert b == a and type(b) is type(a)


def test_round_trip_is_exact(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, TENSORS, STATE)
    tensors, state = load_checkpoint(path)
    assert tensors.keys() == TENSORS.keys()
    for name, tensor in TENSORS.items():
        _assert_same(tensor, tensors[name])
    _assert_same(STATE, state)
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_restored_generator_continues_the_same_stream(tmp_path):
    rng = np.random.Generator(np.random.PCG64(123))
    rng.random(10)
    save_checkpoint(tmp_path / "c.safetensors", {}, {"rng": rng.bit_generator.state})
    expected = rng.random(5)
    _, state = load_checkpoint(tmp_path / "c.safetensors")
    restored = np.random.Generator(np.random.PCG64())
    restored.bit_generator.state = state["rng"]
    np.testing.assert_array_equal(restored.random(5), expected)


def test_overwrite_replaces_the_previous_checkpoint(tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    save_checkpoint(path, {"w": np.ones(4, np.float32)}, {"epoch": 2})
    tensors, state = load_checkpoint(path)
    assert state == {"epoch": 2} and tensors["w"].tolist() == [1, 1, 1, 1]
    assert os.listdir(tmp_path) == ["c.safetensors"]


def test_failed_rename_keeps_the_old_checkpoint_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": np.zeros(3, np.float32)}, {"epoch": 1})

    def crash(src, dst):
        assert os.path.getsize(src) > 0 and os.path.dirname(src) == str(tmp_path)
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(_checkpoint.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"w": np.ones(3, np.float32)}, {"epoch": 2})
    monkeypatch.undo()
    tensors, state = load_checkpoint(path)
    assert state == {"epoch": 1} and tensors["w"].tolist() == [0, 0, 0]
    assert os.listdir(tmp_path) == ["c.safetensors"]


def test_failed_encoding_writes_nothing(tmp_path):
    path = tmp_path / "c.safetensors"
    with pytest.raises(TypeError, match=r"state\['bad'\]\[1\]: set is not storable"):
        save_checkpoint(path, {}, {"bad": [1, {2}]})
    assert os.listdir(tmp_path) == []


def test_process_killed_before_rename_leaves_the_old_checkpoint(tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    script = textwrap.dedent(f"""
        import os, numpy as np
        from blueprint.task import _checkpoint
        _checkpoint.os.replace = lambda src, dst: os._exit(9)   # die hard, no cleanup
        _checkpoint.save_checkpoint({str(path)!r}, {{"w": np.ones(3, np.float32)}}, {{"epoch": 2}})
    """)
    assert subprocess.run([sys.executable, "-c", script], cwd=ROOT).returncode == 9
    tensors, state = load_checkpoint(path)
    assert state == {"epoch": 1} and tensors["w"].tolist() == [0, 0, 0]
    leftovers = sorted(set(os.listdir(tmp_path)) - {"c.safetensors"})
    assert len(leftovers) == 1 and leftovers[0].startswith(".c.safetensors.") and leftovers[0].endswith(".tmp")
    save_checkpoint(path, {"w": np.ones(3, np.float32)}, {"epoch": 3})  # a later save still works ...
    assert load_checkpoint(path)[1] == {"epoch": 3}
    assert os.listdir(tmp_path) == ["c.safetensors"]  # ... and removed the orphan temporary file


# ---- integrity ----------------------------------------------------------------------------------
def _data_start(path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def _flip(path, start: int, count: int = 16) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(start, start + count):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_flipped_data_bytes_are_refused_naming_the_file(tmp_path, where):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, TENSORS, STATE)
    start, end = _data_start(path), path.stat().st_size
    _flip(path, {"first": start, "middle": (start + end) // 2, "last": end - 16}[where])
    with pytest.raises(_checkpoint.CheckpointIntegrityError, match="tensor data does not match its sha256") as caught:
        load_checkpoint(path)
    assert str(path) in str(caught.value) and isinstance(caught.value, ValueError)


def test_an_edited_header_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, TENSORS, {"epoch": 7})
    raw = path.read_bytes()
    assert raw.count(b'\\"epoch\\": 7') == 1
    path.write_bytes(raw.replace(b'\\"epoch\\": 7', b'\\"epoch\\": 8'))   # same length, still valid JSON
    with pytest.raises(_checkpoint.CheckpointIntegrityError, match="header .* does not match its sha256"):
        load_checkpoint(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_tensors_are_refused_naming_the_tensor(tmp_path, bad):
    path = tmp_path / "c.safetensors"
    tensors = {**TENSORS, "optim.state0.fc.weight": np.array([0.0, bad, 1.0], np.float32)}
    with pytest.MonkeyPatch.context() as patch:   # save refuses such tensors too: write one as another program would
        patch.setattr(_checkpoint, "first_non_finite", lambda tensors: None)
        save_checkpoint(path, tensors, {})
    with pytest.raises(_checkpoint.CheckpointIntegrityError, match="'optim.state0.fc.weight' holds 1 NaN/Inf"):
        load_checkpoint(path)


def test_a_checkpoint_without_digests_is_refused(tmp_path):
    path = tmp_path / "c.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(path), metadata={"blueprint_state": "{}", "blueprint_format": "1"})
    with pytest.raises(ValueError, match="format '1' predates integrity digests"):
        load_checkpoint(path)


def _not_safetensors(path):
    path.write_bytes(b"definitely not a checkpoint")


def _foreign_safetensors(path):
    save_file({"w": np.zeros(2, np.float32)}, str(path), metadata={"format": "pt"})


def _future_format(path):
    save_file({}, str(path), metadata={"blueprint_state": json.dumps({}), "blueprint_format": "99"})


BAD_FILES = [
    (None, FileNotFoundError, "does not exist"),
    (_not_safetensors, ValueError, "is not a blueprint checkpoint: it is not a readable safetensors file"),
    (_foreign_safetensors, ValueError, "metadata has no 'blueprint_state' entry (found keys ['format'])"),
    (_future_format, ValueError, "checkpoint format '99'"),
]


@pytest.mark.parametrize("files, fragment", [
    (["checkpoint.safetensors", "history.jsonl"],
     "is a folder, not a checkpoint file; pass a file in it ({run}/checkpoint.safetensors)"),
    ([], "is a folder, not a checkpoint file; pass a file in it, e.g. a run folder's checkpoint.safetensors"),
])
def test_a_run_folder_given_as_the_checkpoint_names_the_files_in_it(tmp_path, files, fragment):
    run = tmp_path / "run"
    run.mkdir()
    for name in files:
        (run / name).write_bytes(b"")
    with pytest.raises(FileNotFoundError) as info:
        load_checkpoint(run)
    assert fragment.format(run=run) in str(info.value)


@pytest.mark.parametrize("make, error, fragment", BAD_FILES, ids=[b[2] for b in BAD_FILES])
def test_bad_files_raise_clear_errors(tmp_path, make, error, fragment):
    path = tmp_path / "c.safetensors"
    if make is not None:
        make(path)
    with pytest.raises(error) as info:
        load_checkpoint(path)
    assert fragment in str(info.value)


BAD_STATES = [
    ({1: "int key"}, TypeError, "dict keys must be str; found int 1"),
    ({"a": object()}, TypeError, "state['a']: object is not storable"),
    ({"x": {"__ndarray__": 1}}, ValueError, "reserved for arrays"),
    ({"a": np.array([object()])}, TypeError, "arrays of dtype object cannot be stored"),
]


@pytest.mark.parametrize("state, error, fragment", BAD_STATES, ids=[b[2] for b in BAD_STATES])
def test_bad_states_raise_clear_errors(tmp_path, state, error, fragment):
    with pytest.raises(error) as info:
        save_checkpoint(tmp_path / "c.safetensors", {}, state)
    assert fragment in str(info.value)


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="state as a dict"):
        save_checkpoint(tmp_path / "c.safetensors", {}, [1])
    with pytest.raises(TypeError, match=r"tensors as \{str: np.ndarray\}"):
        save_checkpoint(tmp_path / "c.safetensors", {"w": [1.0]}, {})
    with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
        save_checkpoint(tmp_path / "missing" / "c.safetensors", {}, {})


# ---- a checkpoint never runs code -------------------------------------------------------------
def _task_state(**fields):
    from blueprint import zoo
    from blueprint.optim import SGD, ConstantLR, CrossEntropyLoss
    from blueprint.task._task import CHECKPOINT_FORMAT
    state = {"format": CHECKPOINT_FORMAT, "blueprint": repr(zoo.small_cnn()), "loss": repr(CrossEntropyLoss()),
             "optimizer": repr(SGD()), "scheduler": repr(ConstantLR()), "epochs_done": 0, "epochs": 1,
             "batch_size": 8, "seed": 0, "history": []}
    return {**state, **fields}


@pytest.mark.parametrize("field", ["blueprint", "loss", "optimizer", "scheduler"])
def test_loading_a_task_parses_its_fields_and_never_runs_them(tmp_path, field):
    from blueprint.task import ConfigError, DeepLearningTask
    sentinel = tmp_path / "executed"
    payload = f"__import__('os').system('touch {sentinel}') or BluePrint(seq(relu()))"
    path = tmp_path / "evil.safetensors"
    save_checkpoint(path, {}, _task_state(**{field: payload}))
    with pytest.raises(ConfigError, match=r"__import__\('os'\)") as caught:
        DeepLearningTask.load(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
    assert not sentinel.exists()
    save_checkpoint(path, {}, _task_state())
    task = DeepLearningTask.load(path)
    assert repr(task.blueprint_value) == _task_state()["blueprint"] and task.batch == 8


@pytest.mark.parametrize("field, value", [("epochs", None), ("seed", "0"), ("batch_size", True), ("blueprint", None)])
def test_a_task_checkpoint_with_a_missing_or_mistyped_field_is_a_one_line_error(tmp_path, field, value):
    from blueprint.task import ConfigError, DeepLearningTask
    path = tmp_path / "c.safetensors"
    state = _task_state()
    state[field] = value
    save_checkpoint(path, {}, state)
    with pytest.raises(ConfigError) as caught:
        DeepLearningTask.load(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_save_replacing_the_file_during_a_load_never_mixes_the_two(tmp_path, monkeypatch):
    """Issue 24 item 4: the tensors and both digests come from one read of one open file, so a save that
    replaces the path while a load runs (every epoch's save does) gives the old checkpoint whole, never
    old metadata with new bytes ("corrupted or edited")."""
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": np.zeros(4, np.float32)}, {"epoch": 1})
    parse_tensors = _checkpoint.safetensors_load

    def parse_then_replace(raw):
        tensors = parse_tensors(raw)
        save_checkpoint(path, {"w": np.ones(4, np.float32)}, {"epoch": 2})   # the next epoch's save lands now
        return tensors
    monkeypatch.setattr(_checkpoint, "safetensors_load", parse_then_replace)
    tensors, state = load_checkpoint(path)
    assert state == {"epoch": 1} and np.array_equal(tensors["w"], np.zeros(4, np.float32))
    monkeypatch.undo()
    tensors, state = load_checkpoint(path)
    assert state == {"epoch": 2} and np.array_equal(tensors["w"], np.ones(4, np.float32))
