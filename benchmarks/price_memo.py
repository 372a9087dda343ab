"""How far the simulator's step memo (`simulator.des.pricing.StepPricer`) is from pricing every
step directly: random steps of decode, prefill and aggregated instances of DeepSeek-V4-Flash on
GB300 and DeepSeek-V3 on H200, priced both ways, at a choice of rounding bits.

Prints, per case, the relative error of the step time: median, p90, p99, max, and the share of
steps over 0.5 % (how often the memo prices a step is in `benchmarks/simulate_speed.py`).
Run: .venv/bin/python benchmarks/price_memo.py [--bits 6] [--steps 200]
"""

from __future__ import annotations

import argparse

import numpy as np

from simulator.calibration import load_calibration
from simulator.cost import Batch, step_time
from simulator.cost.step import instance_from_role
from simulator.des.pricing import StepPricer
from simulator.des.simulate import SimOptions
from simulator.specs.deployment import RoleSpec, Speculative
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model

SYSTEMS = (("deepseek-v4-flash", "gb300"), ("deepseek-v3", "h200"))
ROLES = (
    ("decode", RoleSpec(instances=1, dep=16, speculative=Speculative(tokens=3, acceptance=0.8))),
    ("prefill", RoleSpec(instances=1, dep=4)),
    ("aggregated", RoleSpec(instances=1, dep=8)),
)


Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def random_step(role: str, dp: int, rng: np.random.Generator) -> Rows:
    """Per-rank rows of one step: lognormal contexts, integer tokens and requests."""
    def spread(lo: float, hi: float) -> np.ndarray:
        return np.exp(rng.uniform(np.log(lo), np.log(hi), dp))

    z = np.zeros(dp)
    if role == "decode":
        return rng.integers(1, 65, dp).astype(float), spread(100, 1e6), z, z, z
    if role == "prefill":
        return (z, z, rng.integers(1, 8193, dp).astype(float),
                rng.integers(1, 5, dp).astype(float),
                np.where(rng.random(dp) < 0.3, 0.0, spread(1, 5e5)))
    return (rng.integers(0, 64, dp).astype(float), spread(100, 2e5),
            rng.integers(1, 8193, dp).astype(float), np.ones(dp), spread(1, 1e5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, default=SimOptions.price_bits,
                        help=f"rounding bits (default {SimOptions.price_bits}, the simulator's)")
    parser.add_argument("--steps", type=int, default=200, help="random steps per case")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    if not 1 <= args.bits <= 52:
        parser.error(f"--bits {args.bits} must be between 1 and 52")
    rng = np.random.default_rng(args.seed)
    print(f"step memo at {args.bits} bits vs direct pricing, {args.steps} random steps a case")
    print(f"{'case':34} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8} {'>0.5%':>7}")
    for model, hardware in SYSTEMS:
        hw, m = load_hardware(hardware), load_model(model)
        cal = load_calibration(hw)
        for role, spec in ROLES:
            inst = instance_from_role(m, hw, role, spec, "fp8", "fp8")
            pricer = StepPricer(inst, cal, args.bits)
            errors = []
            for _ in range(args.steps):
                rows = random_step(role, inst.dp, rng)
                tokens = rows[0] * (1 + inst.spec_tokens) + rows[2]
                experts = np.sort(rng.uniform(1.0, 1.3, inst.ep))[::-1] * (
                    tokens.sum() * m.top_k / inst.ep)
                dec, ctx, pre, req, pctx = rows
                direct = step_time(inst, Batch(dec, ctx, pre, req, pctx, experts), cal)
                memo = pricer.price(dec, ctx, pre, req, pctx, experts)
                errors.append(abs(memo.total_ms / direct.total_ms - 1))
            e = np.array(errors) * 100
            print(f"{model + ' ' + role:34} {np.median(e):7.3f}% {np.quantile(e, 0.9):7.3f}% "
                  f"{np.quantile(e, 0.99):7.3f}% {e.max():7.3f}% {(e > 0.5).mean() * 100:6.1f}%")


if __name__ == "__main__":
    main()
