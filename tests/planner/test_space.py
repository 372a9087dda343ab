"""The search space: which DEP sizes, redundant experts and MTP settings it offers, how points
map to deployments (a drawn point over the GPU budget to its repair within it), and that
infeasible points are rejected before any simulation."""

import itertools
import random
from typing import Any

import optuna
import pytest

from planner.space import (
    SearchSpace,
    build_space,
    check,
    deployment_from_params,
    deployment_key,
    enumerate_params,
    largest_dep,
    mtp_options,
    nearest,
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


class Drawn:
    """A trial that draws the given value for a name (checked against the choices), the first
    choice for any other name; `params` records the draws, as an Optuna trial does."""

    def __init__(self, given: dict[str, Any]) -> None:
        self.given = given
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        value = self.given.get(name, choices[0])
        assert value in choices, (name, value, choices)
        self.params[name] = value
        return value

    def suggest_int(self, name: str, low: int, high: int) -> int:
        value = self.given.get(name, low)
        assert low <= value <= high, (name, value, low, high)
        self.params[name] = value
        return int(value)


class Uniform(Drawn):
    """A trial that draws every value uniformly from a seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__({})
        self.rng = rng

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.params[name] = self.rng.choice(choices)
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        self.params[name] = self.rng.randint(low, high)
        return int(self.params[name])


SPACES = {
    "r1-h200-24": lambda: build_space("deepseek-r1", "h200", 24),
    "v4-flash-gb300-72": lambda: build_space("deepseek-v4-flash", "gb300", 72),  # the demo's
}


def pd_draws(space: SearchSpace, redundant: bool) -> list[dict[str, Any]]:
    """Every P/D combination of DEP sizes and instance counts (and redundant experts where
    `redundant`; else each DEP's last option), the rest of the draw at its first choice."""
    per_role = {}
    for role in ("prefill", "decode"):
        per_role[role] = [
            {f"{role}_dep": dep, f"{role}_instances_dep{dep}": n, f"{role}_redundant_dep{dep}": r}
            for dep in space.deps
            for n in range(space.instance_range(role, dep)[0],
                           space.instance_range(role, dep)[1] + 1)
            for r in (space.redundant[dep] if redundant else space.redundant[dep][-1:])]
    return [{"layout": "pd", **p, **d}
            for p, d in itertools.product(per_role["prefill"], per_role["decode"])]


@pytest.mark.parametrize("name", SPACES)
def test_no_drawn_combination_is_over_the_budget(name):
    space = SPACES[name]()
    draws = pd_draws(space, redundant=name == "r1-h200-24")
    repaired = 0
    for given in draws:
        trial = Drawn(given)
        d = suggest(trial, space)
        assert d.prefill is not None and d.decode is not None
        assert d.gpus_used <= space.gpus, given
        assert d == deployment_from_params(space, trial.params)
        drawn = {role: (given[f"{role}_dep"], given[f"{role}_instances_dep{given[f'{role}_dep']}"],
                        given[f"{role}_redundant_dep{given[f'{role}_dep']}"])
                 for role in ("prefill", "decode")}
        if sum(dep * n for dep, n, _ in drawn.values()) <= space.gpus:  # the point itself
            for role, (dep, n, r) in drawn.items():
                assert (d.roles[role].dep, d.roles[role].instances,
                        d.roles[role].redundant_experts) == (dep, n, r)
            continue
        repaired += 1
        room = space.gpus - d.prefill.gpus
        if d.decode.dep != drawn["decode"][0]:  # the largest decode DEP that fits
            assert d.decode.dep == largest_dep(space, room) < drawn["decode"][0]
            assert d.decode.redundant_experts == nearest(space.redundant[d.decode.dep],
                                                         drawn["decode"][2])
        if d.prefill.dep != drawn["prefill"][0]:  # only where no decode instance fits beside it
            assert drawn["prefill"][0] + space.deps[0] > space.gpus
            assert d.prefill.instances == 1
        else:  # every drawn prefill instance that fits beside the decode one
            assert (d.prefill.instances == drawn["prefill"][1]
                    or d.gpus_used + drawn["prefill"][0] > space.gpus)
        for role, r in d.roles.items():
            assert r.dep is not None and r.redundant_experts in space.redundant[r.dep]
            low, high = space.instance_range(role, r.dep)
            assert low <= r.instances <= high  # a point of the space, within the budget
    assert repaired  # the combinations include points over the budget


@pytest.mark.parametrize("name", SPACES)
def test_no_random_draw_is_over_the_budget(name):
    space, rng = SPACES[name](), random.Random(0)
    layouts = set()
    for _ in range(10000):
        trial = Uniform(rng)
        d = suggest(trial, space)
        assert d.gpus_used <= space.gpus, trial.params
        assert d == deployment_from_params(space, trial.params)
        layouts.add(trial.params["layout"])
    assert layouts == {"pd", "aggregated"}


def test_a_decode_dep_too_wide_takes_the_widest_that_fits():
    space = build_space("deepseek-v4-flash", "gb300", 72)
    assert space.redundant[72] == (32,) and space.redundant[64] == (0, 64)
    d = suggest(Drawn({"layout": "pd", "prefill_dep": 8, "prefill_instances_dep8": 8,
                       "decode_dep": 72, "decode_redundant_dep72": 32}), space)
    assert d.prefill is not None and d.decode is not None
    assert (d.prefill.instances, d.prefill.dep) == (1, 8)
    assert (d.decode.instances, d.decode.dep, d.decode.redundant_experts) == (1, 64, 0)
    d = suggest(Drawn({"layout": "pd", "prefill_dep": 1, "prefill_instances_dep1": 30,
                       "decode_dep": 72}), space)  # prefill keeps what fits beside DEP64
    assert d.prefill is not None and d.decode is not None
    assert (d.prefill.instances, d.decode.dep, d.gpus_used) == (8, 64, 72)
    d = suggest(Drawn({"layout": "pd", "prefill_dep": 24, "prefill_instances_dep24": 2,
                       "decode_dep": 56, "decode_redundant_dep56": 24}), space)
    assert d.prefill is not None and d.decode is not None
    assert (d.prefill.gpus, d.decode.dep, d.decode.redundant_experts) == (24, 48, 32)


def test_a_prefill_dep_with_no_room_beside_it_gives_way():
    space = build_space("deepseek-v4-flash", "gb300", 72)
    d = suggest(Drawn({"layout": "pd", "prefill_dep": 72, "decode_dep": 8}), space)
    assert d.prefill is not None and d.decode is not None
    assert (d.prefill.dep, d.prefill.redundant_experts, d.decode.dep) == (64, 0, 8)
    d = suggest(Drawn({"layout": "pd", "prefill_dep": 72, "decode_dep": 72}), space)
    assert d.prefill is not None and d.decode is not None
    assert (d.prefill.dep, d.decode.dep) == (8, 64)  # decode keeps the widest it can
    space = build_space("deepseek-r1", "h200", 24)
    d = suggest(Drawn({"layout": "pd", "prefill_dep": 24, "prefill_redundant_dep24": 32,
                       "decode_dep": 24}), space)
    assert d.prefill is not None and d.decode is not None
    assert (d.prefill.dep, d.prefill.redundant_experts, d.decode.dep) == (8, 32, 16)


@pytest.mark.parametrize(("space", "points"), [
    (small_space, 3008), (SPACES["r1-h200-24"], 59808)], ids=["small", "r1-h200-24"])
def test_enumeration_is_every_point_within_the_budget_and_the_repair_stays_in_it(space, points):
    space = space()
    listed = list(enumerate_params(space))
    assert len(listed) == points
    keys = set()
    for params in listed:
        d = deployment_from_params(space, params)
        for role, r in d.roles.items():  # the point itself, not a repair
            assert (r.dep, r.instances, r.redundant_experts) == (
                params[f"{role}_dep"], params[f"{role}_instances_dep{r.dep}"],
                params[f"{role}_redundant_dep{r.dep}"])
        keys.add(deployment_key(d))
    assert len(keys) == points
    for given in pd_draws(space, redundant=True):
        assert deployment_key(suggest(Drawn(given), space)) in keys


def test_adjacent_points_move_one_knob_from_the_deployed_plan():
    from planner.space import adjacent_points
    space = small_space()
    point = {"layout": "pd", "prefill_dep": 8, "prefill_instances_dep8": 3,
             "prefill_redundant_dep8": 0, "prefill_max_num_batched_tokens": 8192,
             "decode_dep": 8, "decode_instances_dep8": 3, "decode_redundant_dep8": 0,
             "decode_max_num_seqs": 32, "decode_mtp_tokens": 0,
             "decode_all2all": "deepep_low_latency"}
    origin = deployment_from_params(space, point)
    moved = [deployment_from_params(space, p) for p in adjacent_points(space, point)]
    assert origin not in moved and len({m.model_dump_json() for m in moved}) == len(moved)
    # the drawn 3 + 3 instances of DEP8 are repaired to the 32 GPUs first: moves start there
    assert all(m.gpus_used <= 32 for m in moved)
    # each knob in turn: a decode batch limit up (32 -> 128), draft tokens on, a DEP up
    assert any(m.decode.max_num_seqs == 128 and m.prefill == origin.prefill for m in moved)
    assert any(m.decode.speculative and m.decode.speculative.tokens == 1 for m in moved)
    up = [m for m in moved if m.prefill.dep == 16]
    assert up and all(m.prefill.redundant_experts in space.redundant[16] for m in up)


def test_the_decode_batch_limit_moves_down_to_the_first_choice_that_binds():
    """A limit of 128 sequences on ranks that hold about 20 requests hardly binds, nor would 64:
    the move down goes to 16, the choice nearest to what the ranks hold. Without the estimate,
    or where the limit binds, it moves to the next choice down."""
    from planner.space import adjacent_points

    space = build_space("deepseek-r1", "h200", 32, deps=(8, 16),
                        max_num_seqs=(8, 16, 32, 64, 128, 256), mtp_tokens=(0,))
    point = {"layout": "pd", "prefill_dep": 8, "prefill_instances_dep8": 1,
             "prefill_redundant_dep8": 0, "prefill_max_num_batched_tokens": 8192,
             "decode_dep": 8, "decode_instances_dep8": 1, "decode_redundant_dep8": 0,
             "decode_max_num_seqs": 128, "decode_mtp_tokens": 0,
             "decode_all2all": "deepep_low_latency"}

    def limits(params, running=None):
        origin = deployment_from_params(space, params)
        return sorted(d.decode.max_num_seqs for d in (
            deployment_from_params(space, p) for p in adjacent_points(space, params, running))
            if d.decode.max_num_seqs != origin.decode.max_num_seqs)

    assert limits(point) == [64, 256]
    assert limits(point, running=20.0) == [16, 256]
    assert limits({**point, "decode_max_num_seqs": 16}, running=20.0) == [8, 32]  # binds
    assert limits(point, running=4.0) == [8, 256]  # below every choice: the smallest
    assert limits(point, running=26.0) == [32, 256]


def test_vllm_on_an_nvl72_rack_also_tries_the_nvlink_one_sided_exchange():
    """vLLM's recipes on GB200 / GB300 exchange tokens over the NVLink one-sided kernels,
    which the cost model prices there from a measurement: the search tries them; not on
    H200, and not where MegaMoE's fused exchange runs (V4 with fp4 experts on Blackwell)."""
    gb = build_space("deepseek-r1", "gb200", 32)
    assert "flashinfer_nvlink_one_sided" in gb.all2all
    assert "flashinfer_nvlink_one_sided" not in build_space("deepseek-r1", "h200", 32).all2all
    assert "flashinfer_nvlink_one_sided" not in build_space(
        "deepseek-v4.1-flash", "gb300", 72).all2all
    chosen = build_space("deepseek-r1", "gb200", 32, all2all=("deepep_low_latency",))
    assert chosen.all2all == ("deepep_low_latency",)
