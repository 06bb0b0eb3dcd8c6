"""The planner: BluePrint -> ArchPlan (expander + passes) -> CompiledPlan (shapes, graphs, memory)."""
from planner._arch import ArchLayer, ArchPlan
from planner.expand import arch_plan_from_blueprint
from planner._expand_py import ExpandError

ArchPlan.from_blueprint = staticmethod(arch_plan_from_blueprint)


def build_kind() -> str:
    """Which planner implementation runs: "cython" (the compiled modules) or "pure-python" (the twins)."""
    import importlib.util
    import os
    if os.environ.get("BLUEPRINT_PURE_PYTHON") == "1":
        return "pure-python"
    compiled = all(importlib.util.find_spec(m) is not None for m in ("planner._expand_c", "planner._memory_c"))
    return "cython" if compiled else "pure-python"

__all__ = ["ArchLayer", "ArchPlan", "ExpandError", "arch_plan_from_blueprint", "build_kind"]
