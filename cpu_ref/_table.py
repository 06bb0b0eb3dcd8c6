"""The CPU path's kernel table: every primitive's forward and backward, registered against its `Prim`.

Activations register their scalar pair in ``cpu_ref/_activation.py``; every other kind its
handler in ``cpu_ref/_executor.py``. `CpuExecutor` checks a plan against the table when it is
built (`KernelTable.check_plan`).
"""
from planner.kernel_table import KernelTable
from planner.ops import OPS


def _home(prim) -> str:
    return "cpu_ref/_activation.py (pointwise(...))" if OPS[prim].activation else "cpu_ref/_executor.py"


CPU = KernelTable("cpu", _home)
