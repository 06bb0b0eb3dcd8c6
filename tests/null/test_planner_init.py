"""Parameter layouts: internal (channels last) <-> PyTorch (channels first), checked against index
arithmetic written out by hand, both directions, and always as copies."""
from __future__ import annotations

import numpy as np
import pytest

from planner.plan import ParamSpec
from planner.init import from_torch_layout, to_torch_layout, torch_shape


def spec(shape, layout="", flatten_from=()):
    return ParamSpec("w", 0, shape, "params", "zeros", 0, layout, flatten_from)


CASES = [
    ("conv 3x3", spec((4, 3, 3, 2), "ohwi"), (4, 2, 3, 3)),
    ("conv 1x1", spec((4, 1, 1, 2), "ohwi"), (4, 2, 1, 1)),
    ("fc after flatten", spec((5, 2 * 3 * 4), "fc_hwc", (2, 3, 4)), (5, 24)),
    ("fc after a 1x1 map", spec((5, 4), "fc_hwc", (1, 1, 4)), (5, 4)),
    ("fc", spec((5, 6)), (5, 6)),
]


def expected_torch(s, value):
    """The PyTorch value, element by element: OIHW[o, i, y, x] = OHWI[o, y, x, i]; an fc weight's
    CHW feature (c, y, x) is the internal HWC feature (y, x, c)."""
    out = np.empty(torch_shape(s), value.dtype)
    if s.torch_layout == "ohwi":
        for o, y, x, i in np.ndindex(*value.shape):
            out[o, i, y, x] = value[o, y, x, i]
    elif s.torch_layout == "fc_hwc":
        h, w, c = s.flatten_from
        for o, y, x, ch in np.ndindex(value.shape[0], h, w, c):
            out[o, (ch * h + y) * w + x] = value[o, (y * w + x) * c + ch]
    else:
        out[...] = value
    return out


@pytest.mark.parametrize("what, s, shape", CASES, ids=[c[0] for c in CASES])
def test_layouts_convert_both_ways_as_copies(what, s, shape):
    value = np.arange(np.prod(s.shape), dtype=np.float32).reshape(s.shape)
    torch_value = to_torch_layout(s, value)
    assert torch_shape(s) == shape == torch_value.shape
    assert np.array_equal(torch_value, expected_torch(s, value))
    assert np.array_equal(from_torch_layout(s, torch_value), value)
    assert not np.shares_memory(torch_value, value)
    assert not np.shares_memory(from_torch_layout(s, torch_value), torch_value)
    assert torch_value.flags.c_contiguous
