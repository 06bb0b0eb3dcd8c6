"""The planner: BluePrint -> ArchPlan (expander + passes) -> CompiledPlan (shapes, graphs, memory)."""
from planner._arch import ArchLayer, ArchPlan
from planner.expand import arch_plan_from_blueprint
from planner._expand_py import ExpandError

ArchPlan.from_blueprint = staticmethod(arch_plan_from_blueprint)

__all__ = ["ArchLayer", "ArchPlan", "ExpandError", "arch_plan_from_blueprint"]
