"""ONNX export of the eval graph: every zoo model (and every primitive kind) at a small input,
run by onnxruntime against our CPU forward; the ONNX checker passes on each."""
import numpy as np
import pytest


import blueprint
from blueprint import (BluePrint, Model, add2, avgpool, bn, channel_padding, conv, conv_dw, drop_path, dropout, fc,
                       flatten, gap, identity, maxpool, se, seq, zoo)
from blueprint._onnx import ONNX as ONNX_TABLE
from planner import ArchPlan
from planner.ops import Prim

from tests.support.kind_params import PARAMETERISED, examples, kind_layer  # noqa: E402

onnx = pytest.importorskip("onnx", reason="onnx not installed: pip install \".[onnx]\" in the blueprint-nn source tree")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: pip install \".[onnx]\" in the blueprint-nn source tree")

MAX_RELATIVE_ERROR = 1e-4   # max |ours - onnxruntime| / max |ours|: float32 summation orders differ
SMALL_IMAGE = (32, 32, 3)   # the ImageNet zoo models at a CIFAR-sized input keep the test quick


def small_input(name):
    shape = zoo.MODELS[name].input_shape
    return SMALL_IMAGE if shape[0] > SMALL_IMAGE[0] else shape


# One network per primitive kind of the op table, each with a flatten of H, W > 1 (fc weights in C, H, W
# order): a kind whose DSL factory has its name and runs with no arguments (every activation, prelu) gets
# conv -> kind -> flatten -> fc at its parameters' non-default examples (tests/support/kind_params.py); the
# structural kinds have a network each below. test_every_kind_has_an_onnx_network fails for a kind with neither.
def _leaf_network(prim):
    layer = kind_layer(prim, examples(prim)) if prim in PARAMETERISED else getattr(blueprint, prim.value)()
    return BluePrint(seq(conv(3, 3, 1, 1), layer, flatten(), fc(4)), prim.value), (4, 4, 3)


STRUCTURAL = {
    Prim.CONV: (BluePrint(seq(conv(6, 3, 1, 1), conv_dw(3, 2, 1), conv(4, 1), flatten(), fc(3))), (5, 5, 3)),
    Prim.BN2D: (BluePrint(seq(conv(6, 3, 1, 1), bn(), maxpool(2, 2), flatten(), fc(3))), (6, 6, 3)),
    Prim.BN1D: (BluePrint(seq(conv(6, 3, 1, 1), flatten(), fc(7), bn(), fc(3, bias=False))), (4, 4, 3)),
    Prim.DROPOUT: (BluePrint(seq(conv(5, 3, 1, 1), dropout(0.5), gap(), fc(4))), (5, 5, 3)),
    Prim.DROP_PATH: (BluePrint(seq(conv(6, 3, 1, 1), se(0.5, "hardsigmoid", "silu"), drop_path(0.3), gap(), fc(4))),
                     (5, 5, 3)),
    Prim.FLATTEN: (BluePrint(seq(conv(4, 3, 1, 1), flatten(), fc(3))), (3, 3, 3)),
    Prim.FC: (BluePrint(seq(gap(), fc(6), fc(3, bias=False))), (3, 3, 3)),
    Prim.MAXPOOL: (BluePrint(seq(conv(4, 3, 1, 1), maxpool(3, 2, 1), flatten(), fc(3))), (6, 6, 3)),
    Prim.AVGPOOL: (BluePrint(seq(conv(4, 3, 1, 1), avgpool(3, 2, 1), flatten(), fc(3))), (6, 6, 3)),
    Prim.GAP: (BluePrint(seq(conv(4, 3, 1, 1), gap(), fc(3))), (4, 4, 3)),
    Prim.CHANNEL_PAD: (BluePrint(seq(conv(5, 3, 1, 1), channel_padding(8), flatten(), fc(4))), (3, 3, 3)),
    Prim.ADD: (BluePrint(seq(conv(4, 3, 1, 1), add2(identity(), seq(conv(4, 3, 1, 1), bn())), gap(), fc(3))),
               (4, 4, 3)),
    Prim.CHANNEL_MUL: (BluePrint(seq(conv(6, 3, 1, 1), se(4), gap(), fc(4))), (4, 4, 3)),
}
EXPORTED = [prim for prim in Prim if "forward" in ONNX_TABLE.required(prim)]   # not the loss head
KIND_CASES = {f"kind-{prim.value}": STRUCTURAL[prim] if prim in STRUCTURAL else _leaf_network(prim)
              for prim in EXPORTED if prim in STRUCTURAL or hasattr(blueprint, prim.value)}
# running_var scale: at var ~1 the signal of MobileNetV2, V3 and EfficientNet-B0 vanishes in eval mode (their
# logits would not depend on the input, and the comparison would check nothing); the residual nets would
# overflow at 0.1
BN_VARIANCE = {"mobilenet_v2": 0.1, "mobilenet_v3_large": 0.1, "mobilenet_v3_small": 0.1,
               "efficientnet_b0": 0.1}
CASES = {**{name: (entry.build(), small_input(name)) for name, entry in zoo.MODELS.items()}, **KIND_CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnxruntime_runs_the_exported_eval_graph_as_our_forward_does(name, tmp_path):
    blueprint, shape = CASES[name]
    model = Model(blueprint, shape, seed=1)
    variance = BN_VARIANCE.get(name, 1.0)
    rng = np.random.default_rng(0)
    model.load_state_dict({k: (variance * (rng.random(v.shape) + 0.5)).astype(np.float32)
                           if k.endswith("running_var") else
                           (rng.standard_normal(v.shape) * 0.1).astype(np.float32) if k.endswith("running_mean")
                           else v for k, v in model.state_dict().items()})   # BN statistics that matter
    path = model.export_onnx(tmp_path / f"{name}.onnx")
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version >= 17 and proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    x = rng.standard_normal((3,) + shape).astype(np.float32)
    ours = model.logits(x)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = session.run(["logits"], {"input": x.transpose(0, 3, 1, 2)})[0]
    assert theirs.shape == ours.shape
    assert np.ptp(ours, axis=0).max() > 1e-3 * np.abs(ours).max(), "the logits must depend on the input"
    assert np.abs(theirs - ours).max() / np.abs(ours).max() < MAX_RELATIVE_ERROR


@pytest.mark.parametrize("prim", EXPORTED, ids=str)
def test_every_kind_has_an_onnx_network(prim):
    """Each exported kind has its network in CASES, and that network's plan holds the kind."""
    name = f"kind-{prim.value}"
    assert name in KIND_CASES, (f"{prim.value}: no ONNX accuracy network; give its DSL factory the kind's name (and "
                                f"defaults) or add it to STRUCTURAL in tests/cpu/test_onnx.py")
    bp, shape = KIND_CASES[name]
    assert prim in {layer.kind for layer in ArchPlan.from_blueprint(bp, in_channels=shape[-1]).layers}


def test_a_fixed_batch_export_has_that_batch(tmp_path):
    model = Model(zoo.small_cnn(), (8, 8, 1))
    proto = onnx.load(str(model.export_onnx(tmp_path / "fixed.onnx", batch=4)))
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == [4, 1, 8, 8]
    with pytest.raises(ValueError, match="positive int or None"):
        model.export_onnx(tmp_path / "bad.onnx", batch=0)
