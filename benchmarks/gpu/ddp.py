"""gpu_check's data-parallel section: the CUDA path on 2 GPUs (torchrun, NCCL on the step's stream).

With 2 or more GPUs it trains resnet20 on the synthetic set for EPOCHS epochs once on 1 GPU and
once on 2 (``torchrun --nproc-per-node N -m blueprint train --device cuda``, the same global batch),
and records each run's last-epoch images/s (the first epoch includes compiling), its validation
accuracy and the scaling (2-GPU images/s / 1-GPU images/s); then the 2-GPU run again with
``--sync-batchnorm`` (the BN sums' NCCL all-reduces in the captured step). With one GPU it says so and runs
nothing (a note, not a failure). Needs nccl4py (``pip install 'nccl4py[cu13]'``) and torch.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SECTION = "data-parallel"
MODEL, BATCH, EPOCHS = "resnet20", 256, 3
RUN_TIMEOUT_S = 240
REPO = Path(__file__).resolve().parents[1]


def data_parallel(out, failures, notes):
    from numba import cuda

    from .protocol import Unit
    gpus = len(cuda.gpus)
    with Unit(out, SECTION, failures) as unit:
        unit.fields["gpus"] = gpus
        if gpus < 2:
            line = f"{SECTION}: this device has {gpus} GPU; the 2-GPU data-parallel run needs 2 (not run)"
            print(line)
            notes.append(line)
            unit.status = "not-run"
            return
        runs = {n: _train(n) for n in (1, 2)}
        synced = _train(2, sync_batchnorm=True)
        unit.fields.update(runs=runs, scaling=runs[2]["images_per_second"] / runs[1]["images_per_second"],
                           sync_batchnorm=synced)
        print(f"{SECTION}: {MODEL} batch {BATCH}: 1 GPU {runs[1]['images_per_second']:.0f} img/s, 2 GPUs "
              f"{runs[2]['images_per_second']:.0f} img/s (x{unit.fields['scaling']:.2f}), 2 GPUs with sync BN "
              f"{synced['images_per_second']:.0f} img/s; val accuracy {runs[1]['val_accuracy']:.3f} / "
              f"{runs[2]['val_accuracy']:.3f} / {synced['val_accuracy']:.3f}")


def _train(processes: int, sync_batchnorm: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                   "-m", "blueprint", "train", "--device", "cuda", "--model", MODEL, "--data", "synthetic",
                   "--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--out", folder, "--quiet"] + \
            (["--sync-batchnorm"] if sync_batchnorm else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        run = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=folder)
        if run.returncode != 0:
            raise RuntimeError(f"{processes} process(es): exit {run.returncode}: {run.stderr[-1500:]}")
        last = json.loads((Path(folder) / "history.jsonl").read_text().splitlines()[-1])
        return {"images_per_second": last["images_per_second"], "val_accuracy": last["val_accuracy"]}
