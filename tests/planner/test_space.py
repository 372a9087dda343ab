"""The search space: which DEP sizes, redundant experts and MTP settings it offers, how points
map to deployments, and that infeasible points are rejected before any simulation."""

import optuna
import pytest

from planner.space import (
    build_space,
    check,
    deployment_from_params,
    enumerate_params,
    mtp_options,
    redundant_options,
    suggest,
)
from simulator.cost.memory import check_memory
from simulator.specs.deployment import Deployment, RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import load_model


def test_h200_space_keeps_dep_sizes_that_hold_the_model():
    space = build_space("deepseek-r1", "h200", 32)
    assert space.deps == (8, 16, 24, 32)  # DEP1..4 cannot hold DeepSeek-R1 on H200
    model, hw = load_model("deepseek-r1"), load_hardware("h200")
    with pytest.raises(SpecError, match="does not fit"):
        check_memory("decode", model, hw, RoleSpec(dep=4), "fp8", "fp8")
    for dep, options in space.redundant.items():
        assert options and all((256 + r) % dep == 0 for r in options)
    assert space.redundant[8] == (0, 16, 32, 64)
    assert space.redundant[24] == (8, 32)  # 256 % 24 != 0: the smallest valid count first
    assert space.mtp_tokens == (0, 1, 2, 3)
    assert space.layouts == ("pd", "aggregated")


def test_nvl72_space_offers_a_rack_wide_instance():
    space = build_space("deepseek-r1", "gb300", 72)
    assert space.deps[-1] == 72 and space.redundant[72] == (32,)
    assert 4 in space.deps  # 298 GB hold a quarter of the experts


def test_models_without_mtp_get_no_speculative_choice():
    assert mtp_options(load_model("qwen3-235b-a22b")) == (0,)
    assert redundant_options(load_model("qwen3-235b-a22b"), 24) == (16,)  # 144 = 24 x 6
    assert redundant_options(load_model("qwen3-235b-a22b"), 8) == (0, 8, 16, 32)


def test_nothing_fits_is_one_clear_error():
    with pytest.raises(SpecError, match="fits no DEP size on 4 x h200"):
        build_space("deepseek-r1", "h200", 4)
    with pytest.raises(SpecError, match="layouts"):
        build_space("deepseek-r1", "h200", 16, layouts=("mixed",))


def test_pd_needs_room_for_two_instances():
    assert build_space("deepseek-r1", "h200", 8).layouts == ("aggregated",)


def small_space():
    return build_space("deepseek-r1", "h200", 32, deps=(8, 16), max_num_seqs=(32, 128),
                       max_num_batched_tokens=(8192,), mtp_tokens=(0, 1),
                       all2all=("deepep_low_latency",))


def test_enumeration_lists_every_point_within_budget_once():
    space = small_space()
    points = list(enumerate_params(space))
    deployments = [deployment_from_params(space, p) for p in points]
    assert all(d.gpus_used <= 32 for d in deployments)
    keys = {d.model_dump_json() for d in deployments}
    assert len(keys) == len(points)
    # pd: prefill (3 x DEP8 counts + 1 x DEP16) x redundant (4 / 4) ... all within 32 GPUs
    assert any(d.aggregated for d in deployments) and any(d.prefill for d in deployments)
    assert max(d.gpus_used for d in deployments) == 32


def test_suggest_draws_deployments_through_a_trial():
    space = small_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        trial = study.ask()
        d = suggest(trial, space)
        assert isinstance(d, Deployment)
        assert d == deployment_from_params(space, trial.params)
        assert d.model == "deepseek-r1" and d.hardware == "h200"
        study.tell(trial, 0.0)


def test_instances_are_cut_to_the_budget_left():
    space = small_space()
    params = {"layout": "pd", "prefill_dep": 8, "prefill_instances_dep8": 3,
              "prefill_redundant_dep8": 0, "prefill_max_num_batched_tokens": 8192,
              "decode_dep": 16, "decode_instances_dep16": 1, "decode_redundant_dep16": 0,
              "decode_max_num_seqs": 32, "decode_mtp_tokens": 0,
              "decode_all2all": "deepep_low_latency"}
    d = deployment_from_params(space, params)
    assert d.prefill is not None and d.prefill.instances == 2 and d.gpus_used == 32
    params = {"layout": "pd", "prefill_dep": 16, "prefill_instances_dep16": 1,
              "prefill_redundant_dep16": 0, "prefill_max_num_batched_tokens": 8192,
              "decode_dep": 8, "decode_instances_dep8": 3, "decode_redundant_dep8": 0,
              "decode_max_num_seqs": 32, "decode_mtp_tokens": 1,
              "decode_all2all": "deepep_low_latency"}
    d = deployment_from_params(space, params)
    assert d.decode is not None and d.decode.instances == 2 and d.gpus_used == 32
    assert d.decode.speculative is not None and d.decode.speculative.tokens == 1


@pytest.mark.parametrize(("roles", "needle"), [
    ({"prefill": RoleSpec(instances=3, dep=8), "decode": RoleSpec(dep=16)},
     "uses 40 GPUs (prefill 3 x DEP8, decode 1 x DEP16) but the budget is 32"),
    ({"prefill": RoleSpec(dep=8), "decode": RoleSpec(dep=8, redundant_experts=4)},
     "dep=8 must divide routed+redundant experts"),
    ({"prefill": RoleSpec(dep=4), "decode": RoleSpec(dep=8)}, "does not fit DEP4"),
])
def test_check_rejects_with_the_reason(roles, needle):
    d = Deployment(model="deepseek-r1", hardware="h200", **roles)
    with pytest.raises(SpecError) as e:
        check(d, small_space())
    assert needle in str(e.value)


def test_check_passes_a_feasible_point():
    d = Deployment(model="deepseek-r1", hardware="h200", prefill=RoleSpec(dep=8),
                   decode=RoleSpec(dep=16, redundant_experts=16))
    resolved = check(d, small_space())
    assert set(resolved.roles) == {"prefill", "decode"}


def test_dual_batch_overlap_is_searched_where_the_backend_runs_it():
    space = build_space("deepseek-r1", "h200", 32, deps=(8, 16), max_num_seqs=(64,),
                        max_num_batched_tokens=(8192,), mtp_tokens=(0,))
    points = list(enumerate_params(space))
    deployments = [deployment_from_params(space, p) for p in points]
    with_dbo = [d for d in deployments if any(r.dbo for r in d.roles.values())]
    assert with_dbo and len(with_dbo) < len(deployments)
    for d in with_dbo:
        for name, r in d.roles.items():
            assert not r.dbo or r.backend(name) in ("deepep_low_latency",
                                                     "deepep_high_throughput")
    keys = {d.model_dump_json() for d in deployments}
    assert len(keys) == len(deployments)  # no point repeats another with dbo dropped
