"""The data-parallel all-reduces on the CUDA path: where the launch tape records them.

NCCL itself needs GPUs (nccl4py); here its test double (`RecordingCollectives`, one replica)
stands in, so the simulator checks the tape's order and that the entries run once per replay and
change nothing for one replica. The 2-GPU run is benchmarks/gpu/check.py's data-parallel section.
"""
import numpy as np
import pytest

from blueprint import BluePrint, fc, relu, seq
from blueprint.optim import SGD, CrossEntropyLoss
from cuda_kernels import CudaExecutor
from cuda_kernels.collective import CollectiveEntry, RecordingCollectives
from cuda_kernels.tape import LaunchTape, device_span
from cuda_kernels.vector import one_element_name
from planner import ArchPlan
from planner.compiler import Compiler

BATCH, FEATURES, CLASSES = 4, 8, 3
UPDATE_KERNELS = ("sgd_step", "adam_step")


def _executor(collectives=None):
    arch = ArchPlan.from_blueprint(BluePrint(seq(fc(6), relu(), fc(CLASSES))), in_channels=FEATURES, amp=True)
    plan = Compiler(arch).compile({"train": (BATCH, 1, 1, FEATURES), "eval": (BATCH, 1, 1, FEATURES)},
                                  optimizer_state_slots=1)
    ex = CudaExecutor(plan, CrossEntropyLoss(), SGD().lr(0.1).momentum(0.9), seed=2, replay="eager")
    if collectives is not None:
        ex.collectives = collectives
    return ex


def _batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, 1, 1, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, BATCH)


def _overlaps(entry, span):
    return any(a < span[1] and span[0] < b for a, b in (device_span(arg) for arg in entry.args
                                                         if hasattr(arg, "__cuda_array_interface__")
                                                         or hasattr(arg, "__array_interface__")))


def test_the_gradient_all_reduce_sits_after_the_last_gradient_write_and_before_the_overflow_check():
    collectives = RecordingCollectives()
    ex = _executor(collectives)
    x, y = _batch()
    ex.train_step(x, y, 0.1)
    tape = ex._runners[("train", "train")].tape
    entries = list(tape)
    kinds = [(e.kind, one_element_name(e.name)) for e in entries]   # a _vec4 kernel or its one-element twin
    average = kinds.index(("collective", "all_reduce_avg_grads"))
    maximum = kinds.index(("collective", "all_reduce_max_overflow"))
    check = kinds.index(("kernel", "check_overflow"))
    update = next(i for i, (kind, name) in enumerate(kinds) if name in UPDATE_KERNELS)
    assert average < check < maximum < update, kinds[average - 1:update + 1]
    grads = device_span(ex._regions["grads"])
    writers_before = [e.name for e in entries[:average] if e.kind == "kernel" and _overlaps(e, grads)]
    users_after = [one_element_name(e.name) for e in entries[average + 1:]
                   if e.kind == "kernel" and _overlaps(e, grads)]
    assert writers_before, "no kernel before the all-reduce writes a gradient: the test finds nothing"
    assert set(users_after) <= {"check_overflow", *UPDATE_KERNELS}, users_after
    assert collectives.calls == [("avg", ex._regions["grads"].size, "float32"), ("max", 1, "int32")]
    before, kernels, after = tape.segments()          # graph capture takes the collectives with the kernels
    assert any(isinstance(e, CollectiveEntry) for e in kernels) and len(before) + len(kernels) + len(after) == len(entries)


def test_one_replica_with_the_collectives_steps_exactly_as_without():
    x, y = _batch()
    plain, replica = _executor(), _executor(RecordingCollectives())
    for ex in (plain, replica):
        ex.train_step(x, y, 0.1)
        ex.train_step(x, y, 0.1)
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(replica.state_dict()[name], value, err_msg=name)
    assert len(replica.collectives.calls) == 4            # two entries per replayed step


def test_graph_capture_takes_collectives_among_kernels_but_still_refuses_a_transfer_there():
    from numba import cuda

    from cuda_kernels import elementwise
    x = cuda.to_device(np.ones(4, np.float16))
    y = cuda.device_array(4, np.float16)
    collective = CollectiveEntry("all_reduce_avg_grads", "avg", y, RecordingCollectives())
    tape = LaunchTape()
    elementwise.activation_forward(tape, "relu", x, y)
    tape.add(collective)
    elementwise.activation_forward(tape, "relu", y, x)
    assert [e.kind for e in tape.segments()[1]] == ["kernel", "collective", "kernel"]
    tape.add(type("Upload", (), {"kind": "upload", "name": "input", "run": lambda self, stream: None})())
    elementwise.activation_forward(tape, "relu", x, y)
    with pytest.raises(ValueError, match=r"transfers \['input'\] sit between kernels"):
        tape.segments()


def test_without_nccl4py_a_cuda_replica_names_what_to_install():
    import importlib.util

    from blueprint import ConfigError
    from blueprint.distributed import Distributed
    from cuda_kernels.collective import NcclCollectives
    if importlib.util.find_spec("nccl") is not None:
        pytest.skip("nccl4py is installed here: the real communicator needs GPUs (gpu_check's data-parallel section)")
    with pytest.raises(ConfigError, match=r"needs nccl4py: pip install 'nccl4py\[cu13\]'"):
        NcclCollectives(Distributed(0, 1))
