"""The tensor-core kernel modules, imported together (their table is ``_mma_tiles.MMA_KERNELS``)."""
import importlib

from ._mma_tiles import MMA_KERNELS

MMA_KERNEL_MODULES = ("_mma_conv", "_mma_wgrad", "_mma_dgrad", "_mma_ops")


def all_mma_kernels():
    """Every tensor-core kernel (imports each module of ``MMA_KERNEL_MODULES``)."""
    for module in MMA_KERNEL_MODULES:
        importlib.import_module(f"{__package__}.{module}")
    return dict(MMA_KERNELS)
