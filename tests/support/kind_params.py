"""Every parameterised kind's parameters, derived from the op table and the DSL records, for the tests.

A kind is *parameterised* here when its op-table row reads parameters (`attrs`), it is shape-preserving and
deterministic (no saved mask), and its DSL factory has the kind's name: every activation with parameters,
and prelu. Its DSL record's fields are the row's attrs, each declared with `bounded` / `at_least`
(`blueprint._layer`), which give the default, the accepted range and a valid non-default `example`.
"""
import dataclasses

import numpy as np

import blueprint
from planner.ops import ACTIVATIONS, KINDS_WITH_EXTRAS, OPS, SHAPE_PRESERVING, Prim

PARAMETERISED = tuple(prim for prim in Prim if prim in SHAPE_PRESERVING and OPS[prim].attrs
                      and prim not in KINDS_WITH_EXTRAS and hasattr(blueprint, prim.value))


def factory(prim):
    return getattr(blueprint, prim.value)   # each DSL factory is named as its kind


def record_fields(prim) -> tuple:
    record = factory(prim)().params
    return () if record is None else dataclasses.fields(record)


def examples(prim) -> dict:
    """A valid non-default value of each parameter, by name (the factory's keyword arguments)."""
    return {f.name: f.metadata["example"] for f in record_fields(prim)}


def defaults(prim) -> dict:
    return {f.name: f.default for f in record_fields(prim)}


def in_attrs_order(prim, values: dict) -> tuple:
    """``values`` (by name) as the reference and scalar pairs take them: positionally, in the row's attrs order."""
    return tuple(values[name] for name in OPS[prim].attrs)


ACTIVATION_EXAMPLES = {prim: in_attrs_order(prim, examples(prim)) for prim in ACTIVATIONS}


# ---- one small network per parameterised kind, and its two oracles ------------------------------------------
CHANNELS = 3                          # the conv's output: prelu's example has one slope per channel
INPUT_SHAPE = (2, 2, 2, CHANNELS)     # (N, H, W, C): tiny, for the simulator
CLASSES = 4
PRELU_SLOPES = (0.1, 0.45, 0.8)       # distinct per channel, none the 0.25 torch starts from


def kind_layer(prim, values: dict):
    return factory(prim)(**values)


def kind_network(prim, values: dict):
    """conv 1x1 -> the kind -> flatten -> fc: the conv's weight gradient goes through the kind's backward."""
    from blueprint import BluePrint, conv, fc, flatten, seq
    return BluePrint(seq(conv(CHANNELS, 1), kind_layer(prim, values), flatten(), fc(CLASSES)), f"{prim.value}_net")


def kind_state(state: dict) -> dict:
    """``state`` (a state dict, PyTorch layout) with prelu's slopes set to PRELU_SLOPES (as many as it has)."""
    return {k: (np.asarray(PRELU_SLOPES[:v.size], np.float32) if k == "1.weight" else v) for k, v in state.items()}


def numpy_forward(prim, values: dict, state: dict, x):
    """The network's logits in float64 from planner/reference.py: the spec every path is held to."""
    from planner import reference as R
    x = np.asarray(x, np.float64)
    h = np.einsum("nhwc,oc->nhwo", x, np.asarray(state["0.weight"], np.float64)[:, :, 0, 0])
    if prim == Prim.PRELU:
        slopes = np.asarray(state["1.weight"], np.float64)[:values["num_parameters"]]   # 1: the first, shared
        a = R.prelu_forward(h, slopes)
    else:
        a = OPS[prim].reference_forward(h, *in_attrs_order(prim, values))
    flat = a.transpose(0, 3, 1, 2).reshape(len(x), -1)      # PyTorch's flatten of NCHW
    return flat @ np.asarray(state["3.weight"], np.float64).T + np.asarray(state["3.bias"], np.float64)


TORCH_NAMES = {"slope": "negative_slope"}   # a parameter PyTorch names differently


def torch_step(prim, values: dict, state: dict, x, y):
    """PyTorch (float32) on the same network and weights: the logits and the parameter gradients of the
    mean cross-entropy, by state-dict name."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    if prim == Prim.PRELU:
        act = nn.PReLU(values["num_parameters"])
    else:
        keywords = {TORCH_NAMES.get(name, name): value for name, value in values.items()}
        act = nn.Module()
        act.forward = lambda t: getattr(F, prim.value)(t, **keywords)
    net = nn.Sequential(nn.Conv2d(CHANNELS, CHANNELS, 1, bias=False), act, nn.Flatten(),
                        nn.Linear(CHANNELS * INPUT_SHAPE[1] * INPUT_SHAPE[2], CLASSES))
    net.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    logits = net(torch.tensor(np.asarray(x, np.float32).transpose(0, 3, 1, 2)))
    F.cross_entropy(logits, torch.tensor(np.asarray(y, np.int64))).backward()
    return logits.detach().numpy(), {k: p.grad.numpy() for k, p in net.named_parameters()}
