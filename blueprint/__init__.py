"""blueprint-nn: define a whole convolutional network as one immutable value, plan it, train it.

>>> from blueprint import seq, conv, bn, relu, gap, fc, BluePrint
>>> bp = BluePrint(seq(conv(16, 3, 1, 1), bn(), relu(), gap(), fc(10)))
>>> print(bp.root)
seq(conv(16, 3, 1, 1), bn(), relu(), gap(), fc(10))
"""
from blueprint._factories import (
    add2, avgpool, block, bn, cbr, cbrp, celu, channel_padding, conv, conv_dw, drop_path, dropout, elu, fc, flatten,
    gap, gap_fc, gelu, group_conv, hardsigmoid, hardswish, hardtanh, identity, leaky_relu, maxpool, mbconv, mish,
    named, prelu, relu, relu6, repeat, se, selu, seq, sigmoid, silu, softplus, tanh,
)
from blueprint._errors import ConfigError
from blueprint._layer import BlockStyle, BluePrint, Kind, Layer, map_layers
from blueprint._model import InputSpec, Model
from blueprint._summary import summary
from blueprint import zoo

__version__ = "0.1.0"

__all__ = [
    "BlockStyle", "BluePrint", "ConfigError", "InputSpec", "Kind", "Layer", "Model", "map_layers", "zoo",
    "add2", "avgpool", "block", "bn", "cbr", "cbrp", "channel_padding", "conv", "conv_dw", "drop_path", "dropout",
    "fc", "flatten", "gap", "gap_fc", "gelu", "group_conv", "hardsigmoid", "hardswish", "identity", "leaky_relu",
    "maxpool", "mbconv", "named", "elu", "celu", "selu", "softplus", "mish", "prelu", "hardtanh", "relu", "relu6",
    "repeat", "se", "seq", "sigmoid", "silu", "tanh", "summary",
]
