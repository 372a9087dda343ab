"""Fake evaluation functions for planner tests (module level, so worker processes can load
them)."""

from __future__ import annotations

import time
from typing import Any

from simulator.specs.deployment import Deployment


def metrics(throughput: float, user: float, ttft: float = 500.0) -> dict[str, Any]:
    """A `simulate --json`-shaped object with the keys the planner reads."""
    tpot = 1000.0 / user
    return {
        "throughput_tok_s_gpu": throughput,
        "tok_s_user": {"p50": user, "p90": user, "mean": user},
        "ttft_ms": {"p50": ttft, "p90": ttft, "p99": ttft, "mean": ttft},
        "tpot_ms": {"p50": tpot, "p90": tpot, "p99": tpot, "mean": tpot},
    }


def decode_role(d: Deployment) -> Any:
    return d.decode or d.aggregated


class BatchTradeoff:
    """Throughput grows with the decode batch limit, tokens/s per user falls with it."""

    def __call__(self, d: Deployment) -> dict[str, Any]:
        r = decode_role(d)
        assert r is not None
        seqs = r.max_num_seqs
        return metrics(throughput=100.0 * seqs / d.gpus_used * 8, user=4000.0 / seqs)


class Planted:
    """One configuration clearly best; elsewhere throughput falls with the distance to it."""

    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target

    def distance(self, d: Deployment) -> int:
        got = {"prefill_dep": d.prefill.dep if d.prefill else None,
               "decode_dep": d.decode.dep if d.decode else None,
               "max_num_seqs": d.decode.max_num_seqs if d.decode else None,
               "mtp": (d.decode.speculative.tokens if d.decode and d.decode.speculative
                       else 0)}
        return sum(got[k] != v for k, v in self.target.items())

    def __call__(self, d: Deployment) -> dict[str, Any]:
        n = self.distance(d)
        return metrics(throughput=5000.0 if n == 0 else 1000.0 - 100.0 * n, user=50.0)


def constant(d: Deployment) -> dict[str, Any]:
    """The same metrics for every deployment."""
    return metrics(throughput=1000.0, user=50.0)


class Sleepy:
    """`constant` after a sleep: an evaluation that takes a while, so that searches sharing a
    study overlap."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, d: Deployment) -> dict[str, Any]:
        time.sleep(self.seconds)
        return constant(d)


class LoadAware:
    """Throughput per GPU grows with the offered load, tokens/s per user falls with it, and
    the rate carried is the GPUs times the load's share (the workload is set by `at`, as
    `planner.evaluate.Simulator.at` sets it for a load sweep)."""

    def __init__(self, workload: Any = None) -> None:
        self.workload = workload

    def at(self, workload: Any) -> LoadAware:
        return LoadAware(workload)

    def load(self) -> float:
        a = self.workload.arrival
        return float(getattr(a, "concurrency", None) or a.rate)

    def __call__(self, d: Deployment) -> dict[str, Any]:
        load = self.load() if self.workload is not None else 64.0
        served = min(load, 4.0 * d.gpus_used)  # a GPU carries at most 4 users' worth
        out = metrics(throughput=100.0 * served / d.gpus_used, user=1000.0 / load)
        return {**out, "gpus": d.gpus_used, "completed": round(10 * served),
                "duration_s": 10.0}
