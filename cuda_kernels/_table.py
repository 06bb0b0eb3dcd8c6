"""The CUDA path's kernel table: every primitive's forward and backward launch, registered against its `Prim`.

Every activation's kernels are generated in ``cuda_kernels/elementwise.py`` from its op-table row's
scalar pair (``planner/scalar_activations.py``); every other kind registers its launcher in
``cuda_kernels/_ops.py``. `CudaExecutor` checks a plan against the table when it is built
(`KernelTable.check_plan`); fused kinds are checked primitive by primitive.
"""
from planner.kernel_table import KernelTable
from planner.ops import OPS


def _home(prim) -> str:
    return ("cuda_kernels/elementwise.py (which generates the kernels from the row's scalar pair in "
            "planner/scalar_activations.py)") if OPS[prim].activation else "cuda_kernels/_ops.py"


CUDA = KernelTable("cuda", _home)
