"""Discrete-event simulation of a deployment serving a workload (SimPy, one event per engine step
or per run of identical decode steps)."""

from simulator.des.experts import ExpertLoad, power_law_popularity, read_expert_counts
from simulator.des.metrics import InstanceInfo, SimResult, Timeline
from simulator.des.pricing import StepPricer
from simulator.des.simulate import SimOptions, simulate
from simulator.des.traces import Trace, read_trace

__all__ = ["ExpertLoad", "InstanceInfo", "SimOptions", "SimResult", "StepPricer", "Timeline",
           "Trace", "power_law_popularity", "read_expert_counts", "read_trace", "simulate"]
