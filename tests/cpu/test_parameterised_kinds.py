"""Every parameterised kind of the op table (tests/support/kind_params.py: each activation with parameters,
and prelu) at NON-DEFAULT parameter values, on the CPU path and through ONNX (onnxruntime), against the
numpy reference (planner/reference.py, float64) and PyTorch (float32): one forward and one backward of
a tiny network (conv 1x1 -> the kind -> flatten -> fc) at identical weights. A handler that reads a
parameter under another name, or not at all, runs the default and fails here.
"""

import numpy as np
import pytest

from blueprint import Model
from blueprint.optim import SGD, CrossEntropyLoss
from cpu_ref import CpuExecutor
from planner import ArchPlan
from planner.compiler import Compiler
from planner.ops import Prim
from tests.support.float32_error import assert_like_float32

from tests.support.kind_params import (INPUT_SHAPE, PARAMETERISED, defaults, examples, kind_network, kind_state,  # noqa: E402
                         numpy_forward, torch_step)

torch = pytest.importorskip("torch", reason="PyTorch not installed: the parity oracle (pip install torch==2.13.0)")

SEED = 2
LABELS = np.array([1, 3])


def batch():
    """Inputs that reach both sides of every kink (and softplus's threshold) after the 1x1 conv."""
    return (2.0 * np.random.default_rng(7).standard_normal(INPUT_SHAPE)).astype(np.float32)


def cpu_executor(prim, values):
    arch = ArchPlan.from_blueprint(kind_network(prim, values), in_channels=INPUT_SHAPE[-1])
    plan = Compiler(arch).compile({"train": INPUT_SHAPE, "eval": INPUT_SHAPE})
    ex = CpuExecutor(plan, CrossEntropyLoss(), SGD(), seed=SEED)
    ex.load_state_dict(kind_state(ex.state_dict()))
    return ex


@pytest.mark.parametrize("prim", PARAMETERISED, ids=str)
def test_the_cpu_path_runs_every_parameter_at_its_value(prim):
    values, x = examples(prim), batch()
    ex = cpu_executor(prim, values)
    state = ex.state_dict()
    reference = numpy_forward(prim, values, state, x)
    theirs, their_grads = torch_step(prim, values, state, x, LABELS)
    ours = ex.forward(x)
    assert np.abs(reference - numpy_forward(prim, defaults(prim), state, x)).max() > 1e-2 * np.abs(reference).max(), (
        "the example values must change the logits, or this test could not see a parameter ignored")
    assert_like_float32(f"{prim} logits", ours, theirs, reference)
    ex.train_step(x, LABELS, lr=0.0)
    grads = ex.gradients()
    assert sorted(grads) == sorted(their_grads)
    scale = max(np.abs(g).max() for g in their_grads.values())
    for name, grad in grads.items():   # against PyTorch: the float64 reference of the backward is torch's own
        np.testing.assert_allclose(grad, their_grads[name], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{prim} {name}")


@pytest.mark.parametrize("prim", PARAMETERISED, ids=str)
def test_onnx_runs_every_parameter_at_its_value(prim, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime",
                                      reason="onnxruntime not installed: pip install 'blueprint-nn[test]'")
    pytest.importorskip("onnx", reason="onnx not installed: pip install 'blueprint-nn[onnx]'")
    values, x = examples(prim), batch()
    model = Model(kind_network(prim, values), INPUT_SHAPE[1:], seed=SEED)
    model.load_state_dict(kind_state(model.state_dict()))
    path = model.export_onnx(tmp_path / f"{prim.value}.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = session.run(["logits"], {"input": x.transpose(0, 3, 1, 2)})[0]
    reference = numpy_forward(prim, values, model.state_dict(), x)
    torch32, _ = torch_step(prim, values, model.state_dict(), x, LABELS)
    assert_like_float32(f"{prim} onnx logits", theirs, torch32, reference)


@pytest.mark.parametrize("slopes", [1, 3], ids=["shared", "per-channel"])
def test_prelu_learns_its_slopes_like_torch(slopes):
    """prelu's weight is `<name>.weight` (torch.nn.PReLU's key), starts at 0.25, and gets torch's gradient."""
    values = {"num_parameters": slopes}
    arch = ArchPlan.from_blueprint(kind_network(Prim.PRELU, values), in_channels=INPUT_SHAPE[-1])
    ex = CpuExecutor(Compiler(arch).compile({"train": INPUT_SHAPE, "eval": INPUT_SHAPE}), CrossEntropyLoss(), SGD(),
                     seed=SEED)
    assert ex.state_dict()["1.weight"].tolist() == [0.25] * slopes
    ex.load_state_dict(kind_state(ex.state_dict()))
    x = batch()
    _, their_grads = torch_step(Prim.PRELU, values, ex.state_dict(), x, LABELS)
    ex.train_step(x, LABELS, lr=0.0)
    got = ex.gradients()["1.weight"]
    assert got.shape == (slopes,) and np.abs(got).min() > 0
    np.testing.assert_allclose(got, their_grads["1.weight"], rtol=1e-4, atol=1e-6)
