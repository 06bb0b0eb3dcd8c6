"""The simulator sees a missing block barrier: the mma / ldmatrix twins synchronise only their own warp
(``cuda_kernels/_mma_twins.py``), so with the main loop's ``bar.sync`` deleted the warps of a block run
apart as on silicon, a warp reads a pipeline stage that other warps' ``cp.async`` copies have not filled
(or poisoned), and the tensor-core forward no longer matches the numpy spec.

Before the twins were per-warp, every twin was a block barrier itself and this mutation passed every
forward test.
"""
import zlib

import numpy as np
import pytest

from cuda_kernels import mma_tiles
from tests.cuda.test_mma_conv import _forward


def _deleted_barrier():
    """The mutation: ``block_barrier()`` does nothing."""


@pytest.mark.parametrize("case", ["3x3-c8-partial-mnk", "7x7-c24-s2-p3"])   # 3 and 37 k-tiles, two warps
def test_the_forward_fails_without_the_main_loops_block_barrier(monkeypatch, case):
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    _forward(rng, case, False)   # with the barrier: matches the spec
    monkeypatch.setattr(mma_tiles, "block_barrier", _deleted_barrier)
    with pytest.raises(AssertionError):
        _forward(rng, case, False)


@pytest.mark.parametrize("case", ["3x3-c8-partial-mnk"])
def test_the_forward_fails_without_the_epilogues_staged_barrier(monkeypatch, case):
    """The epilogue stages its fp16 tile in shared memory and stores it in 16-byte chunks of other threads' values:
    with the barrier between the two deleted, threads read chunks not yet written (the pipeline's leftovers)."""
    from cuda_kernels import mma_conv
    rng = np.random.default_rng(zlib.crc32(case.encode()))
    _forward(rng, case, False)
    monkeypatch.setattr(mma_conv, "staged_barrier", _deleted_barrier)
    with pytest.raises(AssertionError):
        _forward(rng, case, False)


def test_the_input_gradient_fails_without_the_epilogues_staged_barrier(monkeypatch):
    from cuda_kernels import mma_dgrad
    from tests.cuda.test_mma_conv import _dgrad
    rng = np.random.default_rng(zlib.crc32(b"3x3-s1-p1"))
    _dgrad(rng, "3x3-s1-p1")
    monkeypatch.setattr(mma_dgrad, "staged_barrier", _deleted_barrier)
    with pytest.raises(AssertionError):
        _dgrad(rng, "3x3-s1-p1")
