"""The simulator hands a router its candidates as columns; the choice is the list's choice."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.specs.routing import POLICIES, Candidate, Candidates, Router


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_columns_and_a_list_of_candidates_pick_the_same(policy: str) -> None:
    rng = np.random.default_rng(5)
    as_list, as_columns = Router(policy), Router(policy)
    for step in range(300):
        n = int(rng.integers(1, 40))
        # small integers make ties common: ties must go to the first in both forms
        queued = rng.integers(0, 4, n).astype(float) * 1000
        requests = rng.integers(0, 3, n).astype(float)
        cached = rng.integers(0, 3, n).astype(float) * 500
        active = rng.integers(0, 3, n).astype(float) * 700
        prompt = float(rng.integers(1, 3) * 1000)
        session = int(rng.integers(0, 20)) if step % 3 else None
        listed = [Candidate(float(q), float(r), float(c), prompt, float(a))
                  for q, r, c, a in zip(queued, requests, cached, active, strict=True)]
        got = as_columns.pick(Candidates(queued, requests, cached, prompt, active), session)
        assert got == as_list.pick(listed, session)


def test_columns_prefer_the_cached_rank_then_the_first_of_equals() -> None:
    router = Router("prefix_aware")
    cols = Candidates(np.array([0.0, 0.0, 0.0]), np.array([1.0, 0.0, 0.0]),
                      np.array([0.0, 0.0, 0.0]), 4096.0)
    assert router.pick(cols) == 1  # equal new work: fewer requests, then the first
    cols = Candidates(np.array([0.0, 2000.0, 0.0]), np.zeros(3),
                      np.array([0.0, 4000.0, 3000.0]), 4096.0)
    assert router.pick(cols) == 2  # 1096 new tokens beats 96 new + 2000 queued


def test_kv_router_weighs_a_hit_against_the_kv_its_requests_in_flight_hold() -> None:
    # Dynamo's KV router: uncached prompt + queued prompt work + KV held by requests in flight
    router = Router("kv_router")
    cols = Candidates(np.zeros(2), np.array([8.0, 2.0]), np.array([60_000.0, 0.0]), 64_000.0,
                      np.array([800_000.0, 200_000.0]))
    # the hit saves 60,000 tokens of prompt, but the first holds 600,000 more in flight
    assert router.pick(cols) == 1
    assert Router("prefix_aware").pick(cols) == 0  # which prefix_aware does not see
    cols = Candidates(np.zeros(2), np.array([8.0, 2.0]), np.array([60_000.0, 0.0]), 64_000.0,
                      np.array([230_000.0, 200_000.0]))
    assert router.pick(cols) == 0  # 4,000 + 230,000 against 64,000 + 200,000
    # a list of candidates without the KV in flight (0) is prefix_aware
    listed = [Candidate(0.0, 8.0, 60_000.0, 64_000.0), Candidate(0.0, 2.0, 0.0, 64_000.0)]
    assert router.pick(listed) == 0
