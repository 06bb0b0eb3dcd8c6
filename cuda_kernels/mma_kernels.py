"""The tensor-core kernel modules, imported together (their table is ``mma_tiles.MMA_KERNELS``)."""
import importlib

from .mma_tiles import MMA_KERNELS

MMA_KERNEL_MODULES = ("mma_conv", "mma_wgrad", "mma_dgrad", "mma_ops")


def all_mma_kernels():
    """Every tensor-core kernel (imports each module of ``MMA_KERNEL_MODULES``)."""
    for module in MMA_KERNEL_MODULES:
        importlib.import_module(f"{__package__}.{module}")
    return dict(MMA_KERNELS)
