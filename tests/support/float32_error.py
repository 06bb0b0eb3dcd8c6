"""The tolerance of the tests that compare whole networks with PyTorch at identical parameters
(tests/cpu/test_torch_parity.py, test_zoo_se_torchvision.py): our float32 distance to the float64
reference may be at most ``FP32_MULTIPLE`` times PyTorch-float32's distance to it, plus ``FLOOR``
times the quantity's scale."""
import numpy as np

#: Our error may be this many times PyTorch-float32's error on the same step. Two float32
#: implementations that sum in different orders (im2col GEMM vs oneDNN, another BLAS kernel,
#: another thread count) have errors of the same size, not the same value. Over
#: test_torch_parity.py's 6 cases x 3 steps our error used at most 0.52 of the allowance (an Adam
#: update of tiny_mobilenet; measured on an AVX-512 Xeon with its default OpenBLAS kernel and with
#: OPENBLAS_CORETYPE=Sandybridge, with 1 and 2 threads).
FP32_MULTIPLE = 16.0
#: ... plus this, relative to the quantity's scale (its largest entry, or for gradients the
#: largest gradient entry of the whole network): a few float32 epsilons. It only matters where
#: float32's error happens to be tiny, e.g. a gradient that is exactly 0 in exact arithmetic (a
#: BN bias followed by a linear layer and another BN), which is pure rounding noise on both sides.
FLOOR = 8 * float(np.finfo(np.float32).eps)


def assert_like_float32(label, ours, torch32, reference, scale=None, oracle="PyTorch"):
    """``max|ours - reference| <= FP32_MULTIPLE * max|torch32 - reference| + FLOOR * scale``; ``scale`` is
    ``max|reference|`` unless given; ``oracle`` names the float32 side in the failure message."""
    ours, torch32, reference = (np.asarray(a, np.float64) for a in (ours, torch32, reference))
    scale = np.abs(reference).max() if scale is None else scale
    ours_error, float32_error = np.abs(ours - reference).max(), np.abs(torch32 - reference).max()
    allowed = FP32_MULTIPLE * float32_error + FLOOR * max(scale, 1e-30)
    assert ours_error <= allowed, (f"{label}: ours is {ours_error:.3g} from the float64 reference, {oracle}-float32 "
                                   f"{float32_error:.3g} (allowed {allowed:.3g}, scale {scale:.3g})")
