"""Every parameterised kind of the op table (tests/support/kind_params.py) at NON-DEFAULT parameter values on
the CUDA path (fp16 activations; the simulator at tiny shapes), one forward and one backward against the
numpy reference (planner/reference.py) and PyTorch at identical weights. A handler that reads a parameter
under another name, or not at all, runs the default and fails here (tests/cpu/test_parameterised_kinds.py
holds the CPU path and ONNX to the same oracles, at float32's tolerance).
"""

import numpy as np
import pytest

from blueprint.optim import SGD, CrossEntropyLoss
from cuda_kernels import CudaExecutor
from planner import ArchPlan
from planner.compiler import Compiler
from tests.cuda.test_executor import CHECK_SCALE, GRAD_TOL, assert_close

from tests.support.kind_params import (INPUT_SHAPE, PARAMETERISED, defaults, examples, kind_network, kind_state,  # noqa: E402
                         numpy_forward, torch_step)

torch = pytest.importorskip("torch", reason="PyTorch not installed: the parity oracle (pip install torch==2.13.0)")
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

SEED = 2
LABELS = np.array([1, 3])
#: the example values must move the logits by this much (relative, 2-norm) more than the fp16 tolerance,
#: or a handler that ran the defaults could pass
SEPARATION = 5


def batch():
    return (2.0 * np.random.default_rng(7).standard_normal(INPUT_SHAPE)).astype(np.float32)


@pytest.mark.parametrize("prim", PARAMETERISED, ids=str)
def test_the_cuda_path_runs_every_parameter_at_its_value(prim):
    values, x = examples(prim), batch()
    arch = ArchPlan.from_blueprint(kind_network(prim, values), in_channels=INPUT_SHAPE[-1], amp=True)
    plan = Compiler(arch).compile({"train": INPUT_SHAPE, "eval": INPUT_SHAPE})
    # SIMT GEMMs: the kinds under test are elementwise; the tensor-core twins are tested in test_mma_*.py
    ex = CudaExecutor(plan, CrossEntropyLoss(), SGD(), seed=SEED, init_loss_scale=CHECK_SCALE, kernels="simt")
    ex.load_state_dict(kind_state(ex.state_dict()))
    state = ex.state_dict()
    reference = numpy_forward(prim, values, state, x)
    with_defaults = numpy_forward(prim, defaults(prim), state, x)
    assert np.linalg.norm(reference - with_defaults) > SEPARATION * GRAD_TOL * np.linalg.norm(reference)
    theirs, their_grads = torch_step(prim, values, state, x, LABELS)
    assert_close({"logits": ex.forward(x)}, {"logits": reference}, GRAD_TOL, f"{prim} vs the numpy reference")
    ex.train_step(x, LABELS, lr=0.0)
    assert not ex.skipped_last_step
    assert_close(ex.gradients(), their_grads, GRAD_TOL, f"{prim} gradients vs PyTorch")
