"""`keep_earlier`: a fresh run into a folder with an earlier run's checkpoints keeps each one it replaces
under a second name, and leaves the folder as it found it where it replaced nothing."""
import os

from blueprint._run_folder import keep_earlier


def _atomic_write(path, data):
    """As the checkpoint writer saves: a temporary file renamed over the old name."""
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_replaced_checkpoint_is_kept_with_its_old_bytes(tmp_path):
    checkpoint = tmp_path / "checkpoint.safetensors"
    checkpoint.write_bytes(b"earlier run")
    with keep_earlier([checkpoint]) as kept:
        _atomic_write(checkpoint, b"this run")
    assert len(kept) == 1 and kept[0].read_bytes() == b"earlier run" and checkpoint.read_bytes() == b"this run"
    assert kept[0].name.startswith("checkpoint.") and kept[0].name.endswith(".safetensors")
    assert _names(tmp_path) == sorted(["checkpoint.safetensors", kept[0].name])


def test_nothing_replaced_leaves_the_folder_as_it_was(tmp_path):
    checkpoint = tmp_path / "checkpoint.safetensors"
    checkpoint.write_bytes(b"earlier run")
    with keep_earlier([checkpoint, tmp_path / "checkpoint.interrupted.safetensors"]) as kept:
        pass
    assert kept == [] and _names(tmp_path) == ["checkpoint.safetensors"]


def test_a_deleted_interrupt_file_is_kept(tmp_path):
    """A fresh run deletes an interrupt file once its own first epoch is saved: the earlier position survives."""
    interrupted = tmp_path / "checkpoint.interrupted.safetensors"
    interrupted.write_bytes(b"earlier position")
    with keep_earlier([interrupted]) as kept:
        interrupted.unlink()
    assert [k.read_bytes() for k in kept] == [b"earlier position"]


def test_two_kept_names_of_the_same_second_do_not_collide(tmp_path):
    checkpoint = tmp_path / "checkpoint.safetensors"
    kept_all = []
    for data in (b"first", b"second"):
        checkpoint.write_bytes(data)
        os.utime(checkpoint, (1_700_000_000, 1_700_000_000))   # the same modification second both times
        with keep_earlier([checkpoint]) as kept:
            _atomic_write(checkpoint, b"next")
        kept_all += kept
    assert [k.read_bytes() for k in kept_all] == [b"first", b"second"] and len({k.name for k in kept_all}) == 2
