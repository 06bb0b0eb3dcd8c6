"""The op table (`planner.ops`) and the per-path kernel tables (`planner.kernel_table`), without kernels.

Path coverage (every kind registered on the CPU, CUDA and ONNX paths) is checked in
tests/cpu/test_op_coverage.py and tests/cuda/test_op_coverage.py, which import the kernels.
"""

import numpy as np
import pytest

from blueprint import zoo
from planner import ArchPlan
from planner.kernel_table import KernelTable, MissingKernelError, NotOnPathError
from planner.ops import ACTIVATIONS, OPS, TRAIN, OpRow, Prim

from tests.support.every_kind import every_kind, every_kind_plan  # noqa: E402
from tests.support.kind_params import ACTIVATION_EXAMPLES, PARAMETERISED, defaults, examples, record_fields  # noqa: E402


@pytest.mark.parametrize("prim", list(Prim), ids=str)
def test_every_kind_has_one_row_with_its_reference(prim):
    row = OPS[prim]
    assert isinstance(row, OpRow) and row.prim is prim and prim.row is row
    assert callable(row.reference_forward) and callable(row.reference_backward)
    assert row.reference_forward.__module__ == "planner.reference"
    assert set(row.saves) <= {"input", "output"}
    assert row.directions in (TRAIN, ("loss",))


def test_prim_values_are_the_plan_strings():
    assert Prim.RELU == "relu" and OPS["relu"] is OPS[Prim.RELU] and hash(Prim.CONV) == hash("conv")
    kinds = {layer.kind for layer in every_kind_plan().arch.layers}
    assert kinds == {prim.value for prim in Prim}


def test_activations_are_derived_from_the_rows_in_table_order():
    assert ACTIVATIONS == tuple(prim for prim in Prim if OPS[prim].activation)
    assert ACTIVATIONS[:2] == (Prim.RELU, Prim.RELU6) and Prim.GELU in ACTIVATIONS and Prim.CONV not in ACTIVATIONS
    for prim in ACTIVATIONS:
        row = OPS[prim]
        assert len(row.saves) == 1 and row.params(None, [(2, 3)]) == [] and row.macs(None, [(2, 3)], (2, 3)) == 0


@pytest.mark.parametrize("prim", ACTIVATIONS, ids=str)
def test_activation_reference_backward_is_the_derivative_of_its_forward(prim):
    """The pair of every activation row agrees with central differences in float64, away from kinks."""
    row, params = OPS[prim], ACTIVATION_EXAMPLES[prim]   # parameters at non-default values
    x = np.array([-4.1, -2.7, -1.3, -0.4, 0.35, 1.2, 2.6, 4.3, 6.7])
    eps = 1e-6
    numeric = (row.reference_forward(x + eps, *params) - row.reference_forward(x - eps, *params)) / (2 * eps)
    saved = row.reference_forward(x, *params) if row.saves == ("output",) else x
    np.testing.assert_allclose(row.reference_backward(saved, np.ones_like(x), *params), numeric, rtol=1e-6,
                               atol=1e-8)


@pytest.mark.parametrize("slopes", [1, 3], ids=["shared", "per-channel"])
def test_prelu_reference_backward_is_the_derivative_of_its_forward(slopes):
    rng = np.random.default_rng(2)
    x, dy, w = rng.standard_normal((2, 2, 2, 3)), rng.standard_normal((2, 2, 2, 3)), rng.uniform(0.1, 0.9, slopes)
    dx, dw = OPS[Prim.PRELU].reference_backward(x, w, dy)
    eps = 1e-6
    loss = lambda x_, w_: float((OPS[Prim.PRELU].reference_forward(x_, w_) * dy).sum())
    for k in range(slopes):
        step = np.eye(slopes)[k] * eps
        assert abs((loss(x, w + step) - loss(x, w - step)) / (2 * eps) - dw[k]) < 1e-7
    np.testing.assert_allclose(dx, np.where(x > 0, dy, w * dy))


def test_every_parameterised_kind_declares_its_parameters_with_a_non_default_example():
    """What the executor tests run each parameterised kind at (tests/support/kind_params.py) comes from here."""
    assert {Prim.LEAKY_RELU, Prim.ELU, Prim.CELU, Prim.SOFTPLUS, Prim.PRELU} <= set(PARAMETERISED)
    assert {prim for prim in ACTIVATIONS if OPS[prim].attrs} <= set(PARAMETERISED)
    for prim in PARAMETERISED:
        assert {f.name for f in record_fields(prim)} == set(OPS[prim].attrs), prim   # the record's fields are the attrs
        for name, value in examples(prim).items():
            assert value != defaults(prim)[name], (prim, name)


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "vgg11_bn", "mlp"])
def test_the_expander_emits_exactly_the_params_each_row_reads(name):
    entry = zoo.MODELS[name]
    arch = ArchPlan.from_blueprint(entry.build(), in_channels=entry.input_shape[2])
    for layer in arch.layers:
        assert tuple(key for key, _ in layer.params) == OPS[layer.kind].attrs, layer.path


def test_every_kind_network_covers_the_table():
    """tests/support/every_kind.py must hold every kind: the path coverage tests run it."""
    arch = ArchPlan.from_blueprint(every_kind(), in_channels=3)
    for layer in arch.layers:
        assert tuple(key for key, _ in layer.params) == OPS[layer.kind].attrs, layer.path
    assert {layer.kind for layer in arch.layers} == set(Prim)


# ---- the per-path kernel table -------------------------------------------------------------------------
def _table():
    return KernelTable("test", lambda prim: f"tests/{prim.value}.py")


def test_lookup_returns_what_was_registered_for_the_kind():
    table = _table()

    @table.implements((Prim.BN2D, Prim.BN1D), "forward")
    def bn_forward():
        return "bn"

    assert table.lookup("bn2d", "forward") is bn_forward and table.lookup(Prim.BN1D, "forward") is bn_forward
    assert table.covers(Prim.BN2D, "forward") and not table.covers(Prim.BN2D, "backward")


def test_a_missing_implementation_names_the_kind_the_direction_the_path_and_the_file():
    with pytest.raises(MissingKernelError, match=r"the test path has no backward implementation of 'gelu' "
                                                 r"\(seq\.gelu\); register one with "
                                                 r"@implements\(Prim\.GELU, 'backward'\) in tests/gelu\.py"):
        _table().lookup("gelu", "backward", "seq.gelu")


def test_a_kind_outside_the_op_table_is_refused():
    with pytest.raises(MissingKernelError, match="'cbr' is not a primitive kind of the op table"):
        _table().lookup("cbr", "forward")


def test_not_on_path_raises_its_reason():
    table = _table()
    table.not_on_path(Prim.DROPOUT, "backward", "dropout is inference-only here")
    assert table.covers(Prim.DROPOUT, "backward")
    with pytest.raises(NotOnPathError, match="'dropout' has no backward on the test path: dropout is inference-only"):
        table.lookup(Prim.DROPOUT, "backward")


@pytest.mark.parametrize("second", ["register", "not_on_path"])
def test_a_kind_is_registered_once(second):
    table = _table()
    table.register(Prim.ADD, "forward", print)
    with pytest.raises(ValueError, match="'add' forward is registered twice"):
        if second == "register":
            table.register(Prim.ADD, "forward", print)
        else:
            table.not_on_path(Prim.ADD, "forward", "no")


@pytest.mark.parametrize("prim, direction", [("relu", "forward"), (Prim.RELU, "sideways")])
def test_registration_takes_a_prim_and_a_direction_of_the_path(prim, direction):
    with pytest.raises(ValueError, match="expected a Prim and one of"):
        _table().register(prim, direction, print)


def test_check_plan_fails_on_the_first_kind_without_an_implementation():
    """What an executor runs when it is built: every (kind, direction) of the plan's schedules."""
    plan = every_kind_plan()
    table = _table()
    for prim in Prim:
        for direction in table.required(prim):
            if (prim, direction) != (Prim.SILU, "backward"):
                table.register(prim, direction, print)
    with pytest.raises(MissingKernelError, match=r"no backward implementation of 'silu' \(seq\[\d+\]\.silu\); "
                                                 r"register one with .* in tests/silu\.py"):
        table.check_plan(plan)
    table.register(Prim.SILU, "backward", print)
    table.check_plan(plan)


def test_check_plan_can_be_limited_to_the_directions_a_path_runs():
    """An exporter runs the forward ops only: a table of forward builders passes for them, not for all."""
    plan = every_kind_plan()
    table = _table()
    for prim in Prim:
        if "forward" in OPS[prim].directions:
            table.register(prim, "forward", print)
    table.check_plan(plan, ("forward",))
    with pytest.raises(MissingKernelError, match="no (loss|backward) implementation"):
        table.check_plan(plan)


def test_a_parameter_the_layer_does_not_carry_raises_instead_of_a_default():
    """The bug this guards against: handlers read every activation's parameter as leaky_relu's "slope", and
    elu ran with the default whatever its alpha."""
    elu = next(layer for layer in every_kind_plan().arch.layers if layer.kind == Prim.ELU)
    assert elu.param("alpha") == 1.0
    with pytest.raises(KeyError, match=r"the elu layer has no parameter 'slope', only \['alpha'\]"):
        elu.param("slope")
