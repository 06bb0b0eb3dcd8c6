"""The planner: BluePrint -> ArchPlan (expander + passes) -> CompiledPlan (shapes, graphs, memory)."""
from planner import _build
from planner._arch import NETWORK_INPUT, ArchLayer, ArchPlan
from planner._expand_error import ExpandError
from planner.expand import arch_plan_from_blueprint

ArchPlan.from_blueprint = staticmethod(arch_plan_from_blueprint)


def build_kind() -> str:
    """Which planner build runs: "cython" (the compiled modules) or "pure-python" (their source, uncompiled)."""
    return _build.build_kind()


__all__ = ["NETWORK_INPUT", "ArchLayer", "ArchPlan", "ExpandError", "arch_plan_from_blueprint", "build_kind"]
