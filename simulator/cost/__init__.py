"""The step-cost model: one engine step of one instance -> StepTime."""

from simulator.cost.memory import RankMemory, check_memory, rank_memory
from simulator.cost.step import CATEGORIES, Batch, Instance, StepTime, instance_from_role, step_time

__all__ = ["CATEGORIES", "Batch", "Instance", "RankMemory", "StepTime", "check_memory",
           "instance_from_role", "rank_memory", "step_time"]
