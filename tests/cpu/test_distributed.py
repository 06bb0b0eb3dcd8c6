"""Data-parallel training (blueprint.distributed) on gloo, 2 processes on localhost.

The multi-process tests start two workers (tests/support/ddp_worker.py) with torchrun's
environment variables, one thread each, on a free port, under a timeout, and compare what the
workers saved. Numerical comparisons are made one step at a time at identical parameters (each
side starts every step from the float64 reference's state rounded to float32) and judged
against float32's own error on that step, exactly as tests/cpu/test_torch_parity.py does: our
distance to the float64 reference may be at most FP32_MULTIPLE times PyTorch-float32's, plus
FLOOR times the quantity's scale (tests/support/float32_error.py).
"""
import contextlib
import os
import re
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: data-parallel training runs on torch.distributed "
                                            "(pip install \".[distributed]\" in the blueprint-nn source tree)")
from torch.utils.data import DistributedSampler  # noqa: E402

from blueprint.distributed import Distributed, ShardedLoader, replica_seed, shard_samples  # noqa: E402
from blueprint.task import ConfigError, DeepLearningTask  # noqa: E402
from blueprint.task._replica_task import check_world_size  # noqa: E402
from blueprint.task.data import ArrayDataset, Augment, DataLoader  # noqa: E402
from tests.support.float32_error import assert_like_float32  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "ddp_worker.py"
WORLD = 2
LAUNCH_TIMEOUT_S = 150                        # a whole launch; a hang fails the test instead of CI
STALL_TIMEOUT_S = 4.0                         # ddp_worker.STALL_TIMEOUT_S
# The killed and bad_input cases run with a collective timeout (ddp_worker.NEVER_S) that cannot expire within
# LAUNCH_TIMEOUT_S: a survivor that stops was stopped by the fault. No assertion here reads a duration
# against an upper bound (a loaded machine is slow, not wrong).


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case: str, out_dir: Path) -> list[subprocess.CompletedProcess]:
    """Run ``case`` on WORLD ranks (as torchrun would start them); returns each rank's finished process."""
    port = _free_port()
    env = {**os.environ, "WORLD_SIZE": str(WORLD), "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    ranks = [subprocess.Popen([sys.executable, str(WORKER), case, str(out_dir)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    finished = []
    for rank, process in enumerate(ranks):
        try:
            out, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in ranks:
                p.kill()
            pytest.fail(f"{case}: rank {rank} did not finish within {LAUNCH_TIMEOUT_S} s")
        finished.append(subprocess.CompletedProcess(process.args, process.returncode, out))
    return finished


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp")
    for rank, result in enumerate(launch("train", out_dir)):
        assert result.returncode == 0, f"rank {rank} failed:\n{result.stdout[-4000:]}"
    return {name: [np.load(out_dir / f"{name}-{r}.npz") for r in range(WORLD)] for name in ("steps", "resume")}


COMPARISONS = [
    # label in the worker, what it compares
    ("mlp", "an MLP without BN on 2 ranks vs one process on the full batch"),
    ("ddp", "a CNN with per-replica BN vs DistributedDataParallel on the same shards"),
    ("syncbn", "the CNN with sync_batchnorm=True vs one process on the full batch"),
]


@pytest.mark.parametrize("label, what", COMPARISONS, ids=[c[0] for c in COMPARISONS])
def test_each_step_matches_the_reference_at_identical_parameters(trained, label, what):
    for rank, saved in enumerate(trained["steps"]):
        quantities = sorted({k.rsplit("/", 1)[0] for k in saved.files if k.startswith(label + "/")})
        assert any("/grad:" in q for q in quantities) and any("/after:" in q for q in quantities), quantities
        for q in quantities:
            assert_like_float32(f"{what}, rank {rank}, {q}", saved[q + "/ours"], saved[q + "/torch32"],
                                 saved[q + "/reference"])


@pytest.mark.parametrize("label", ["mlp", "ddp", "syncbn"])
def test_every_rank_holds_the_same_parameters_after_each_step(trained, label):
    first, second = trained["steps"]
    params = [k for k in first.files if k.startswith(label + "/") and k.endswith("/ours") and "/after:" in k
              and ("running" not in k or label == "syncbn")]     # per-replica BN statistics may differ
    assert params
    for key in params:
        assert np.array_equal(first[key], second[key]), key


def test_resume_of_a_two_rank_run_is_bit_identical(trained):
    for rank, saved in enumerate(trained["resume"]):
        straight = [k for k in saved.files if k.startswith("straight/")]
        assert any("running_var" in k for k in straight) and "straight/history" in straight
        for key in straight:
            assert np.array_equal(saved[key], saved[key.replace("straight/", "resumed/")]), f"rank {rank}: {key}"
    assert np.array_equal(trained["resume"][0]["straight/history"], trained["resume"][1]["straight/history"])


def test_evaluate_on_every_rank_counts_each_sample_once(trained):
    first, second = (saved["evaluate"] for saved in trained["resume"])
    assert first[2] == 21 and np.array_equal(first, second)


def _seconds(line: str) -> float:
    """How long the worker trained before it stopped (``rank r stopped after X s at T: ...``)."""
    return float(re.search(r"stopped after ([0-9.]+) s", line).group(1))


def test_a_rank_that_dies_stops_the_other_with_a_clear_error(tmp_path):
    survivor, killed = launch("killed", tmp_path)
    assert killed.returncode == 17, killed.stdout[-2000:]
    assert survivor.returncode == 3, survivor.stdout[-2000:]
    line = next(line for line in survivor.stdout.splitlines() if line.startswith("rank 0 stopped"))
    assert "DistributedError: rank 0 of 2: the gradient all-reduce of step 3 failed" in line, line


def test_a_rank_that_stops_answering_ends_the_other_after_the_collective_timeout(tmp_path):
    survivor, stalled = launch("stalled", tmp_path)
    line = next((line for line in survivor.stdout.splitlines() if line.startswith("rank 0 stopped")), None)
    assert survivor.returncode == 3 and line is not None, survivor.stdout[-2000:]
    assert "DistributedError: rank 0 of 2: the gradient all-reduce of step 3 failed" in line, line
    assert _seconds(line) >= STALL_TIMEOUT_S, line   # it waited for the timeout (rank 1 answered nothing until rank 0 stopped)


def test_a_bad_input_on_one_rank_is_reported_there_and_stops_all(tmp_path):
    survivor, bad = launch("bad_input", tmp_path)
    assert bad.returncode == 3 and "InputError: the batch contains NaN" in bad.stdout, bad.stdout[-2000:]
    assert survivor.returncode == 3 and "DistributedError: rank 0 of 2" in survivor.stdout, survivor.stdout[-2000:]
    # rank 1 lived on after its error until rank 0 had stopped: rank 0 did not wait for rank 1 to leave
    assert "rank 1 was still alive when rank 0 stopped: True" in bad.stdout, bad.stdout[-2000:]


# ---- single-process checks of the pieces ---------------------------------------------------------------------------
SHARDS = [  # samples, world size, drop_last
    (10, 2, False), (11, 2, False), (11, 2, True), (5, 3, False), (5, 3, True), (1, 2, False), (64, 4, True)]


@pytest.mark.parametrize("samples, world, drop_last", SHARDS)
def test_shards_follow_distributed_sampler_over_the_epoch_permutation(samples, world, drop_last):
    dataset = ArrayDataset(np.zeros((samples, 1, 1, 1), np.float32), np.arange(samples) % 3)
    permutation = DataLoader(dataset, 1, seed=4).order(2)
    for rank in range(world):
        loader = ShardedLoader(dataset, 1, seed=4, drop_last=drop_last, rank=rank, world_size=world)
        want = permutation[list(DistributedSampler(range(samples), world, rank, shuffle=False, drop_last=drop_last))]
        assert loader.order(2).tolist() == want.tolist()
        assert loader.shard_size == shard_samples(samples, world, drop_last) == len(want)


def test_the_ranks_batches_together_are_the_single_process_batch():
    dataset = ArrayDataset(np.arange(40, dtype=np.float32).reshape(40, 1, 1, 1), np.arange(40) % 5)
    single = DataLoader(dataset, 8, seed=1)
    ranks = [ShardedLoader(dataset, 4, seed=1, rank=r, world_size=2) for r in range(2)]
    for step in range(len(single)):
        together = np.concatenate([loader.batch(0, step)[1] for loader in ranks])
        assert sorted(together.tolist()) == sorted(single.batch(0, step)[1].tolist())


def test_evaluation_shards_count_every_sample_once():
    dataset = ArrayDataset(np.zeros((11, 1, 1, 1), np.float32), np.arange(11) % 2)
    orders = [ShardedLoader(dataset, 4, shuffle=False, rank=r, world_size=2, evaluation=True).order(0) for r in (0, 1)]
    assert sorted(np.concatenate(orders).tolist()) == list(range(11))


def test_augmentation_and_dropout_streams_differ_per_rank_and_rank_0_keeps_the_single_process_ones():
    dataset = ArrayDataset(np.zeros((32, 4, 4, 1), np.float32), np.arange(32) % 2)
    augment = Augment(crop_padding=2, hflip=True)
    draws = [ShardedLoader(dataset, 8, augment=augment, rank=r, world_size=2).augment_draws(0, 1, 8) for r in (0, 1)]
    single = DataLoader(dataset, 8, augment=augment).augment_draws(0, 1, 8)
    assert all(np.array_equal(a, b) for a, b in zip(draws[0], single))
    assert not all(np.array_equal(a, b) for a, b in zip(draws[0], draws[1]))
    assert replica_seed(7, 0) == 7 and len({replica_seed(7, r) for r in range(4)}) == 4


def test_distributed_needs_torchrun_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="torchrun --nproc-per-node N"):
        DeepLearningTask().distributed()


def test_global_batch_must_divide_over_the_ranks(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    from blueprint import zoo
    train = ArrayDataset(np.zeros((40, 1, 1, 4), np.float32), np.arange(40) % 3)
    task = DeepLearningTask().model(zoo.mlp([4, 3])).data(train=train, batch_size=6).distributed()
    with pytest.raises(ConfigError, match="batch_size=6 does not divide over world size 4.*batch_size=4"):
        task.validate()
    assert task.data(train=train, batch_size=8).validate()._variants()["train"] == (2, 1, 1, 4)


def test_resuming_with_another_world_size_warns_that_it_is_not_bit_exact():
    with pytest.warns(RuntimeWarning, match="trained on 2 process.*resumes on 1.*not bit-identical"):
        check_world_size("c.safetensors", 2, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_world_size("c.safetensors", 2, Distributed(0, 2))
    with pytest.raises(ConfigError, match="world_size must be an int >= 1"):
        check_world_size("c.safetensors", "2", None)


# ---- the command line ------------------------------------------------------------------------------------------------
def _launcher_environment() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


RENDEZVOUS = {   # how the launcher meets its workers: torchrun's standalone one, or the (watched) c10d endpoint
    "standalone": list,
    "rdzv-endpoint": lambda: ["--nnodes", "1", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"],
}


@pytest.mark.parametrize("rendezvous", RENDEZVOUS)
def test_blueprint_train_nproc_per_node_starts_the_workers_through_torchrun(tmp_path, rendezvous):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "blueprint", "train", "--nproc-per-node", "2", "--epochs", "1",
                             "--out", str(out), "--json", *RENDEZVOUS[rendezvous]()], env=_launcher_environment(),
                            capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(metrics) == 1, result.stdout          # rank 0 alone prints
    assert '"epochs": 1' in metrics[0]
    history = (out / "history.jsonl").read_text().splitlines()
    assert len(history) == 1 and (out / "checkpoint.safetensors").exists()
    from blueprint.task import load_checkpoint
    assert load_checkpoint(out / "checkpoint.safetensors")[1]["world_size"] == 2


RDZV_TIMEOUT_S = 2     # small, so the test is quick; whether the launcher ended is judged by LAUNCH_TIMEOUT_S


def _silent_listener(stack) -> int:
    """A port whose listener accepts connections (the kernel's backlog does) and never answers: torch's store
    client blocks on it past all of its own timeouts."""
    listener = stack.enter_context(socket.socket())
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener.getsockname()[1]


ENDPOINTS = {   # a rendezvous that never completes
    "a silent listener": _silent_listener,                # the launcher's watchdog ends it
    "no other machine joins": lambda stack: _free_port(),  # the launcher hosts it; torchrun's join timeout ends it
}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_rendezvous_that_does_not_complete_is_one_error_line_after_the_rdzv_timeout(tmp_path, endpoint):
    with contextlib.ExitStack() as stack:
        where = f"127.0.0.1:{ENDPOINTS[endpoint](stack)}"
        result = subprocess.run([sys.executable, "-m", "blueprint", "train", "--nproc-per-node", "1", "--nnodes", "2",
                                 "--rdzv-endpoint", where, "--rdzv-timeout", str(RDZV_TIMEOUT_S), "--epochs", "1",
                                 "--out", str(tmp_path / "run")], env=_launcher_environment(), capture_output=True,
                                text=True, timeout=LAUNCH_TIMEOUT_S, cwd=tmp_path, check=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith(f"error: the rendezvous at --rdzv-endpoint {where} did not complete within "
                               f"--rdzv-timeout {RDZV_TIMEOUT_S} s"), lines[0]
    assert lines[0].endswith("or raise --rdzv-timeout") and not (tmp_path / "run").exists()


def test_the_workers_get_every_training_option_but_the_launch_options():
    from blueprint.cli import build_parser
    from blueprint._launch import launcher_arguments, worker_arguments
    args = build_parser().parse_args(["train", "--epochs", "3", "--nproc-per-node", "2", "--sync-batchnorm",
                                      "--nnodes", "2", "--rdzv-endpoint", "h:29400", "--lr", "0.1"])
    worker = worker_arguments(args.train_command, args)
    assert worker[:1] == ["train"] and "--nproc-per-node" not in worker and "--rdzv-endpoint" not in worker
    assert worker[worker.index("--epochs") + 1] == "3" and "--sync-batchnorm" in worker and "0.1" in worker
    assert build_parser().parse_args(worker).epochs == 3     # the workers' command line parses back
    launcher = launcher_arguments(args, worker)
    assert launcher[:4] == ["--nproc-per-node", "2", "--nnodes", "2"] and "h:29400" in launcher
    assert launcher[launcher.index("--module"):][:3] == ["--module", "blueprint", "train"]
    assert launcher[launcher.index("--rdzv-conf") + 1] == "join_timeout=600,read_timeout=600"
    assert "--rdzv-timeout" not in worker


def test_sync_batchnorm_outside_a_data_parallel_run_is_refused_with_the_fix(monkeypatch, capsys, tmp_path):
    from blueprint.cli import main
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["train", "--sync-batchnorm", "--epochs", "1", "--out", str(tmp_path / "run")]) == 2
    assert "--sync-batchnorm applies to data-parallel runs: add --nproc-per-node N" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
