"""gpu_check's data-parallel section on a device with one GPU (the simulator's): it says so and runs nothing."""
from benchmarks.gpu.budget import Budget
from benchmarks.gpu.ddp import SECTION, data_parallel
from benchmarks.gpu.isolate import run_isolated
from benchmarks.gpu.protocol import RecordWriter


def test_one_gpu_is_reported_and_nothing_runs(tmp_path, capsys):
    out, failures, notes = RecordWriter(str(tmp_path / "r.jsonl")), [], []
    try:
        data_parallel(out, Budget(600), failures, [], notes, run_isolated, None)
    finally:
        out.close()
    assert failures == []
    assert notes == [f"{SECTION}: this device has 1 GPU; the 2-GPU data-parallel run needs 2 (not run)"]
    record = (tmp_path / "r.jsonl").read_text()
    assert '"not-run"' in record and '"gpus": 1' in record
    assert notes[0] in capsys.readouterr().out
