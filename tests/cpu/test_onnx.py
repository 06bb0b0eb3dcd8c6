"""ONNX export of the eval graph: every zoo model (and every primitive kind) at a small input,
run by onnxruntime against our CPU forward; the ONNX checker passes on each."""
import numpy as np
import pytest

from blueprint import (BluePrint, Model, avgpool, bn, channel_padding, conv, conv_dw, drop_path, dropout, fc, flatten,
                       gap, gelu, hardsigmoid, hardswish, leaky_relu, maxpool, relu6, se, seq, sigmoid, silu, tanh, zoo)

onnx = pytest.importorskip("onnx", reason="onnx not installed: pip install \".[onnx]\" in the blueprint-nn source tree")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: pip install \".[onnx]\" in the blueprint-nn source tree")

MAX_RELATIVE_ERROR = 1e-4   # max |ours - onnxruntime| / max |ours|: float32 summation orders differ
SMALL_IMAGE = (32, 32, 3)   # the ImageNet zoo models at a CIFAR-sized input keep the test quick


def small_input(name):
    shape = zoo.MODELS[name].input_shape
    return SMALL_IMAGE if shape[0] > SMALL_IMAGE[0] else shape


# every primitive kind the zoo does not use, with a flatten of H, W > 1 (fc weights in C, H, W order)
EXTRA = {
    "gelu_silu_avgpool": (BluePrint(seq(conv(6, 3, 1, 1), gelu(), conv_dw(3, 1, 1), silu(), avgpool(3, 2, 1),
                                        flatten(), fc(5))), (6, 6, 3)),
    "hardswish_leaky_bn1d": (BluePrint(seq(conv(6, 3, 1, 1), hardswish(), conv(6, 1), leaky_relu(0.2), maxpool(2, 2),
                                           flatten(), fc(7), bn(), fc(3, bias=False))), (6, 6, 3)),
    "sigmoid_tanh_relu6_pad": (BluePrint(seq(conv(5, 3, 1, 1), sigmoid(), conv(5, 1), tanh(), relu6(),
                                             channel_padding(8), dropout(0.5), gap(), fc(4))), (5, 5, 3)),
    "hardsigmoid_se_drop_path": (BluePrint(seq(conv(6, 3, 1, 1), hardsigmoid(), se(0.5, "hardsigmoid", "silu"),
                                               drop_path(0.3), gap(), fc(4))), (5, 5, 3)),
}
# running_var scale: at var ~1 the signal of MobileNetV2, V3 and EfficientNet-B0 vanishes in eval mode (their
# logits would not depend on the input, and the comparison would check nothing); the residual nets would
# overflow at 0.1
BN_VARIANCE = {"mobilenet_v2": 0.1, "mobilenet_v3_large": 0.1, "mobilenet_v3_small": 0.1,
               "efficientnet_b0": 0.1}
CASES = {**{name: (entry.build(), small_input(name)) for name, entry in zoo.MODELS.items()}, **EXTRA}


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


def test_a_fixed_batch_export_has_that_batch(tmp_path):
    model = Model(zoo.small_cnn(), (8, 8, 1))
    proto = onnx.load(str(model.export_onnx(tmp_path / "fixed.onnx", batch=4)))
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == [4, 1, 8, 8]
    with pytest.raises(ValueError, match="positive int or None"):
        model.export_onnx(tmp_path / "bad.onnx", batch=0)
