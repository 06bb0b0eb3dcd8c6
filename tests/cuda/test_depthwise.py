"""Depthwise convolutions: 8 channels per thread with 16-byte vectors where ``C % 8 == 0`` (issue 12).

The numerical checks against the numpy spec are rows of ``test_kernels.py`` (channels 4, 12, 8, 16,
24); here: which kernel each channel count gets, and the vector intrinsics' simulator twins (the
16-byte alignment they require, the element order in the b32 registers). The PTX of the vector
kernels is checked in ``test_ptx.py``."""
import numpy as np
import pytest

from cuda_kernels import _conv
from cuda_kernels.registry import SIMULATOR

VECTOR_BACKWARD = ["fill_zero_u32_vec4", "depthwise_backward_weight_vec8", "depthwise_backward_data_vec8"]
SELECTION = [  # (channels, forward kernel, backward kernels)
    (8, "depthwise_forward_vec8", VECTOR_BACKWARD),
    (24, "depthwise_forward_vec8", VECTOR_BACKWARD),
    (12, "depthwise_forward", ["fill_zero_u32_vec4", "depthwise_backward_weight", "depthwise_backward_data"]),
    (4, "depthwise_forward", ["fill_zero_u32_vec4", "depthwise_backward_weight", "depthwise_backward_data"]),
]


class Names:
    def __init__(self):
        self.names = []

    def launch(self, spec, grid, block, *args):
        self.names.append(spec.name)


@pytest.mark.parametrize("channels, forward, backward", SELECTION)
def test_the_vector_kernels_take_multiples_of_8_channels(channels, forward, backward):
    x, dy = np.zeros((1, 4, 4, channels), np.float16), np.zeros((1, 4, 4, channels), np.float16)
    w, dw = np.zeros((channels, 3, 3, 1), np.float16), np.zeros((channels, 3, 3, 1), np.float32)
    fwd, bwd = Names(), Names()
    _conv.conv2d_forward(fwd, x, w, np.zeros_like(dy), 1, 1, channels)
    _conv.conv2d_backward(bwd, x, w, dy, np.zeros_like(x), dw, 1, 1, channels, False)
    assert fwd.names == [forward] and bwd.names == backward


def test_a_misaligned_activation_takes_the_element_kernels():
    raw = np.zeros(1 + 16 * 8 * 2, np.float16)
    x = raw[1:1 + 16 * 8].reshape(1, 4, 4, 8)   # 2 bytes past a 16-byte boundary at best
    assert x.__array_interface__["data"][0] % 16
    names = Names()
    _conv.conv2d_forward(names, x, np.zeros((8, 3, 3, 1), np.float16), np.zeros((1, 4, 4, 8), np.float16), 1, 1, 8)
    assert names.names == ["depthwise_forward"]


@pytest.mark.skipif(not SIMULATOR, reason="the twins are the intrinsics only in the simulator")
def test_vector_twins_move_8_halves_in_order_and_refuse_misaligned_indices():
    from cuda_kernels._mma_twins import ld_global_v4, pack_half2, st_global_v4, unpack_half2
    a = np.arange(24, dtype=np.float16)
    r = ld_global_v4(a, 8)
    assert [tuple(unpack_half2(v)) for v in r] == [(8, 9), (10, 11), (12, 13), (14, 15)]
    assert r[0] == pack_half2(np.float16(8), np.float16(9))
    out = np.zeros(16, np.float16)
    st_global_v4(out, 8, *r)
    assert out[8:].tolist() == list(range(8, 16)) and not out[:8].any()
    for bad in (4, 20):   # not a multiple of 8; past the end
        with pytest.raises(ValueError, match="not the start of a 16-byte vector"):
            ld_global_v4(a, bad)
    with pytest.raises(ValueError, match="not the start of a 16-byte vector"):
        st_global_v4(out, 12, *r)
