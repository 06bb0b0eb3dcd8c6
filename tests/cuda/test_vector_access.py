"""The memory-bound kernels' vector paths move 16 bytes per global access, read from their SASS (issue 23, item 4).

Every kernel of the table named ``*_vec8`` (8 fp16 per access) or ``*_vec4`` (4 fp32) is listed in
``VECTOR_KERNELS`` below, and compiled for sm_90 with its launch signature (``ptxas``, ``cuobjdump --dump-sass``):
none may load or store one fp16 at a time (a 2-byte ``LDG``/``STG``), each must contain a 16-byte access, and
none may spill. Runs WITHOUT NUMBA_ENABLE_CUDASIM; needs ptxas and cuobjdump (no GPU).
"""
import re

import pytest

from cuda_kernels import sass
from cuda_kernels.registry import SIMULATOR, all_kernels
from planner.ops import ACTIVATIONS

pytestmark = [pytest.mark.skipif(SIMULATOR, reason="compile_ptx needs the real numba.cuda, not the simulator"),
              pytest.mark.skipif(not sass.tools_available(),
                                 reason="ptxas, cuobjdump and nvdisasm are not on PATH (pip install "
                                        "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")]

VECTOR_KERNELS = (
    "batchnorm_stats_vec8", "batchnorm_apply_vec8", "batchnorm_apply_residual_vec8",
    "batchnorm_backward_reduce_vec8", "batchnorm_backward_dx_vec8",
    "add_forward_vec8", "accumulate_into_vec8", "cast_f32_to_f16_vec8", "fill_zero_u32_vec4",
    "sgd_step_vec4", "adam_step_vec4", "check_overflow_vec4",
    "maxpool_forward_vec8", "maxpool_backward_vec8", "avgpool_forward_vec8", "avgpool_backward_vec8",
    "gap_forward_vec8", "gap_backward_vec8",
    *[f"activation_{direction}_vec8.{prim.value}" for prim in ACTIVATIONS for direction in ("forward", "backward")],
    "depthwise_forward_vec8", "depthwise_backward_data_vec8", "depthwise_backward_weight_vec8",
    "channel_pad_forward_vec8",
)
# Vector kernels allowed some 2-byte loads, and why (their activations still move in 16-byte vectors).
SCALAR_LOADS_ALLOWED = {
    "depthwise_forward_vec8": "the weights, (C, kh, kw): a vector's 8 channels lie kh*kw apart, one load per tap",
    "depthwise_backward_data_vec8": "the weights, as in the forward",
    "channel_pad_forward_vec8": "the unpadded input, fewer than 8 channels a pixel (6 bytes for RGB): no 16-byte "
                                "vector; every store is one",
}
VECTOR_NAME = re.compile(r"_vec(8|4)\b")


def test_every_vector_kernel_of_the_table_is_listed():
    named = {name for name in all_kernels() if VECTOR_NAME.search(name)}
    assert named == set(VECTOR_KERNELS), (f"unlisted: {sorted(named - set(VECTOR_KERNELS))}, "
                                          f"listed but not in the table: {sorted(set(VECTOR_KERNELS) - named)}")


@pytest.mark.parametrize("name", VECTOR_KERNELS)
def test_vector_kernel_moves_16_bytes_per_access(name):
    k, info = sass.memory_kernel_sass(name)
    narrow = sass.narrow_accesses(k.accesses)
    if name in SCALAR_LOADS_ALLOWED:
        narrow = {key: n for key, n in narrow.items() if key[0] != "load"}
    assert not narrow, f"{name}: scalar fp16 global accesses {narrow} (all: {k.accesses})"
    assert any(size == 16 for _, size in k.accesses), f"{name}: no 16-byte global access ({k.accesses})"
    assert not re.search(r"[1-9]\d* bytes (stack frame|spill)", info), f"{name}: {info}"


def test_the_width_check_sees_a_scalar_fp16_access():
    """The one-element twin of a vector kernel (what a reverted vector path compiles to) fails the check."""
    k, _ = sass.memory_kernel_sass("add_forward")
    assert {("load", 2), ("store", 2)} <= set(sass.narrow_accesses(k.accesses)), k.accesses
