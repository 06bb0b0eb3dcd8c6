"""Every kind of the op table runs on the CPU path and exports to ONNX (or says why not), and a missing
registration fails when the executor is built, naming the kind, the path and the file."""

import numpy as np
import pytest

from blueprint._onnx import ONNX
from cpu_ref import CpuExecutor
from cpu_ref import kernels as K
from cpu_ref._table import CPU
from planner.kernel_table import MissingKernelError, NotOnPathError
from planner.ops import ACTIVATIONS, Prim

from tests.support.every_kind import every_kind_plan  # noqa: E402

PATHS = {"cpu": CPU, "onnx": ONNX}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("prim", list(Prim), ids=str)
def test_every_kind_is_covered_on_the_path(path, prim):
    table = PATHS[path]
    assert table.required(prim), f"{prim} needs no direction on {path}"
    for direction in table.required(prim):
        assert table.covers(prim, direction), f"{path}: {prim} {direction} is neither implemented nor not_on_path"


def test_the_cpu_path_implements_every_kind_it_is_asked_for():
    for prim in Prim:
        for direction in CPU.required(prim):
            assert callable(CPU.lookup(prim, direction))
    assert set(K.ACTIVATION_KERNELS) == set(ACTIVATIONS)


def test_onnx_declares_the_loss_head_not_on_its_path():
    with pytest.raises(NotOnPathError, match="'softmax_ce' has no loss on the onnx path: the exported graph ends at "
                                             "the logits"):
        ONNX.lookup(Prim.SOFTMAX_CE, "loss")


def test_the_executor_runs_a_plan_with_every_kind():
    plan = every_kind_plan()
    ex = CpuExecutor(plan, seed=1)
    x = np.random.default_rng(0).standard_normal(plan.variants["train"].input_shape).astype(np.float32)
    loss = ex.train_step(x, np.array([0, 3]), lr=0.01)
    assert np.isfinite(loss)


@pytest.mark.parametrize("prim, direction, home", [
    (Prim.GELU, "backward", "cpu_ref/_activation.py"),
    (Prim.CHANNEL_PAD, "forward", "cpu_ref/_executor.py"),
    (Prim.SOFTMAX_CE, "loss", "cpu_ref/_executor.py"),
])
def test_a_missing_registration_fails_when_the_executor_is_built(monkeypatch, prim, direction, home):
    plan = every_kind_plan()
    monkeypatch.delitem(CPU._impls, (prim, direction))
    with pytest.raises(MissingKernelError, match=rf"the cpu path has no {direction} implementation of "
                                                 rf"'{prim.value}' .* in {home}"):
        CpuExecutor(plan)


def test_a_missing_onnx_builder_is_refused_before_export(monkeypatch):
    from blueprint import Model
    from blueprint._onnx import build_onnx
    from tests.support.every_kind import every_kind
    model = Model(every_kind(), (8, 8, 3))
    monkeypatch.delitem(ONNX._impls, (Prim.HARDSWISH, "forward"))
    with pytest.raises(MissingKernelError, match=r"the onnx path has no forward implementation of 'hardswish' "
                                                 r".* in blueprint/_onnx\.py"):
        build_onnx(model)


@pytest.mark.parametrize("kind", [Prim.CONV, "gelu2", 7])
def test_an_activation_kernel_refuses_what_is_not_a_registered_activation(kind):
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="activation kernel: expected one of .*'relu'.*, got"):
        K.activation_forward(kind, x, x.copy(), 0.0)
    with pytest.raises(ValueError, match="activation kernel: expected one of"):
        K.activation_backward(kind, x, x, x.copy(), 0.0, False)
