"""gpu_check's data-parallel section: the CUDA path on 2 GPUs (torchrun, NCCL on the step's stream).

With 2 or more GPUs it trains resnet20 on the synthetic set for EPOCHS epochs once on 1 GPU and
once on 2 (``torchrun --nproc-per-node N -m blueprint train --device cuda``, the same global batch),
and records each run's last-epoch images/s (the first epoch includes compiling), its validation
accuracy and the scaling (2-GPU images/s / 1-GPU images/s); then the 2-GPU run again with
``--sync-batchnorm`` (the BN sums' NCCL all-reduces in the captured step). With one GPU it says so and runs
nothing (a note, not a failure). Each run is a unit of its own (``quick_run.run_in_turn``): a process
that starts torchrun and stops it at its timeout; a run that fails is recorded and the next one runs.
Needs nccl4py (``pip install 'nccl4py[cu13]'``) and torch.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SECTION = "data-parallel"
MODEL, BATCH, EPOCHS = "resnet20", 256, 3
RUN_TIMEOUT_S, TEARDOWN_S = 240, 30   # torchrun gets SIGTERM at its timeout (it stops its workers), SIGKILL after
RUN_NEED_S = 60
RUNS = {"1 GPU": {"processes": 1}, "2 GPUs": {"processes": 2},
        "2 GPUs sync-bn": {"processes": 2, "sync_batchnorm": True}}
REPO = Path(__file__).resolve().parents[2]


def data_parallel(out, budget, failures, skipped, notes, runner, env):
    """Each run of ``RUNS`` as a unit of its own (``runner``: a process of its own, which starts torchrun); the
    scaling line. With fewer than 2 GPUs a note and a not-run record."""
    from .isolate import UnitCall
    from .quick_run import Turn, bounded, run_in_turn
    gpus = gpu_count()
    if gpus < 2:
        line = f"{SECTION}: this device has {gpus} GPU; the 2-GPU data-parallel run needs 2 (not run)"
        print(line)
        notes.append(line)
        out.write(SECTION, "not-run", gpus=gpus, reason=line)
        return

    def call(label):
        def make(left):
            run_s = bounded(RUN_TIMEOUT_S, left - TEARDOWN_S)
            return UnitCall(f"{SECTION} {label}", __name__, "train", dict(RUNS[label], timeout_s=run_s),
                            run_s + TEARDOWN_S)
        return make
    outcomes = run_in_turn(out, [Turn(f"{SECTION} {label}", RUN_NEED_S, call(label)) for label in RUNS], budget,
                           failures, skipped, notes, runner, env, gpus=gpus)
    runs = {label: outcomes.get(f"{SECTION} {label}") for label in RUNS}
    ips = {label: o.result.get("images_per_second") if o else None for label, o in runs.items()}
    if ips["1 GPU"] and ips["2 GPUs"]:
        print(f"{SECTION}: {MODEL} batch {BATCH}: 1 GPU {ips['1 GPU']:.0f} img/s, 2 GPUs {ips['2 GPUs']:.0f} img/s "
              f"(x{ips['2 GPUs'] / ips['1 GPU']:.2f}), 2 GPUs with sync BN {ips['2 GPUs sync-bn'] or float('nan'):.0f} "
              f"img/s")


def gpu_count():
    """The GPUs numba sees (no CUDA context is made: this process launches nothing)."""
    from numba import cuda
    return len(cuda.gpus)


def train(processes, timeout_s, sync_batchnorm=False):
    """One ``torchrun`` training run (a unit): its last epoch's images/s and validation accuracy."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
                   "-m", "blueprint", "train", "--device", "cuda", "--model", MODEL, "--data", "synthetic",
                   "--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--out", folder, "--quiet"] + \
            (["--sync-batchnorm"] if sync_batchnorm else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env, cwd=folder)
        try:
            _, stderr = run.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            run.terminate()   # torchrun stops its workers (they run in sessions of their own) on SIGTERM
            _, stderr = run.communicate(timeout=TEARDOWN_S)
            raise TimeoutError(f"{processes} process(es): torchrun ran past {timeout_s:.0f} s: {stderr[-1500:]}")
        if run.returncode != 0:
            raise RuntimeError(f"{processes} process(es): exit {run.returncode}: {stderr[-1500:]}")
        last = json.loads((Path(folder) / "history.jsonl").read_text().splitlines()[-1])
        return {"ok": True, "images_per_second": last["images_per_second"], "val_accuracy": last["val_accuracy"]}
