"""gpu_check's data-parallel section on a device with one GPU (the simulator's): it says so and runs nothing."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks._gpu_ddp import SECTION, data_parallel  # noqa: E402
from benchmarks._gpu_protocol import RecordWriter  # noqa: E402


def test_one_gpu_is_reported_and_nothing_runs(tmp_path, capsys):
    out, failures, notes = RecordWriter(str(tmp_path / "r.jsonl")), [], []
    try:
        data_parallel(out, failures, notes)
    finally:
        out.close()
    assert failures == []
    assert notes == [f"{SECTION}: this device has 1 GPU; the 2-GPU data-parallel run needs 2 (not run)"]
    record = (tmp_path / "r.jsonl").read_text()
    assert '"not-run"' in record and '"gpus": 1' in record
    assert notes[0] in capsys.readouterr().out
