"""The CPU path's kernel table: every primitive's forward and backward, registered against its `Prim`.

Every activation's kernels are generated in ``cpu_ref/_activation.py`` from its op-table row's scalar
pair (``planner/scalar_activations.py``); every other kind registers its handler in
``cpu_ref/_executor.py``. `CpuExecutor` checks a plan against the table when it is built
(`KernelTable.check_plan`).
"""
from planner.kernel_table import KernelTable
from planner.ops import OPS


def _home(prim) -> str:
    return ("cpu_ref/_activation.py (which generates the kernels from the row's scalar pair in "
            "planner/scalar_activations.py)") if OPS[prim].activation else "cpu_ref/_executor.py"


CPU = KernelTable("cpu", _home)
