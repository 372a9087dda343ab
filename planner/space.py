"""The search space: which deployments of one model on one GPU budget the planner may try.

`build_space` keeps only DEP sizes the topology can place and a rank's memory can hold, and per
DEP size only redundant-expert counts that meet vLLM's rule (routed + redundant) % dep == 0.
`suggest` draws a deployment through an Optuna trial (define-by-run; parameters that depend on
the DEP size are named after it, so each name always has the same distribution) and never
yields a deployment over the GPU budget: a drawn point over it stands for its repair, the
nearest point within it (the budget is a ceiling, not a target). `enumerate_params` lists every
point within the budget once, for exhaustive runs. `check` rejects a point before any
simulation: the GPU budget, then `resolve` (model rules, memory, topology).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from simulator.calibration import Calibration
from simulator.calibration.serving import ServingOverhead
from simulator.cost.memory import check_memory
from simulator.resolve import Resolved, resolve
from simulator.specs.deployment import (
    DBO_BACKENDS,
    DEFAULT_BACKEND,
    SM100_HARDWARE,
    All2AllBackend,
    Deployment,
    Precision,
    RoleSpec,
    Speculative,
    experts_divide,
    mtp_tokens_fit,
    uses_mega_moe,
)
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware
from simulator.specs.model import ModelSpec, load_model
from simulator.specs.topology import InstanceRequest, Topology

LAYOUTS = ("pd", "aggregated")
"""pd: separate prefill and decode instances; aggregated: instances that do both."""


class TrialLike(Protocol):
    """The part of optuna.Trial that `suggest` uses."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...
    def suggest_int(self, name: str, low: int, high: int) -> int: ...


@dataclass(frozen=True)
class SearchSpace:
    """Choices per role for one model x hardware x GPU budget (build it with `build_space`)."""

    model: str
    """Model preset name or config path."""
    hardware: str
    """Hardware preset name."""
    gpus: int
    """GPU budget: a deployment may use at most this many GPUs."""
    deps: tuple[int, ...]
    """DEP sizes that fit in memory and on the topology, ascending."""
    redundant: Mapping[int, tuple[int, ...]]
    """DEP size -> redundant-expert counts meeting (routed + redundant) % dep == 0."""
    engine: str = "vllm"
    """Engine whose calibration tables price the steps."""
    precision: Precision = field(default_factory=Precision)
    """Weight and KV-cache dtypes (fixed, not searched)."""
    layouts: tuple[str, ...] = LAYOUTS
    """Layouts tried: pd and/or aggregated."""
    max_num_seqs: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256)
    """Decode (and aggregated) batch limits per rank."""
    max_num_batched_tokens: tuple[int, ...] = (4096, 8192, 16384, 32768)
    """Prefill (and aggregated) step token limits per rank."""
    mtp_tokens: tuple[int, ...] = (0,)
    """Draft tokens of the model's own draft layers, MTP or DSpark (0: off); only (0,) for a
    model without draft layers."""
    mtp_acceptance: float = 0.7
    """Assumed acceptance of each draft token (a property of model and traffic)."""
    all2all: tuple[All2AllBackend | None, ...] = ("deepep_low_latency", "allgather_reducescatter")
    """MoE token exchange tried on decode and aggregated instances (None: the engine's own
    choice, which is MegaMoE where it runs); prefill keeps the default."""
    dbo: tuple[bool, ...] = (False, True)
    """Dual-batch overlap tried per role (vLLM --enable-dbo); only where the role's all2all
    backend runs it."""

    def instance_range(self, role: str, dep: int) -> tuple[int, int]:
        """Instances of `role` at DEP `dep` worth trying: 1 up to what the budget leaves once
        the other role (P/D) has its smallest instance."""
        room = self.gpus - (self.deps[0] if role != "aggregated" else 0)
        return 1, max(room // dep, 1)

    def describe(self) -> dict[str, Any]:
        """Plain data of the space (for the study name and plan provenance)."""
        return {
            "model": self.model, "hardware": self.hardware, "gpus": self.gpus,
            "engine": self.engine, "precision": self.precision.model_dump(),
            "layouts": list(self.layouts), "deps": list(self.deps),
            "redundant": {str(d): list(r) for d, r in self.redundant.items()},
            "max_num_seqs": list(self.max_num_seqs),
            "max_num_batched_tokens": list(self.max_num_batched_tokens),
            "mtp_tokens": list(self.mtp_tokens), "mtp_acceptance": self.mtp_acceptance,
            "all2all": list(self.all2all), "dbo": list(self.dbo),
        }


ONE_SIDED_SYSTEMS = ("gb200", "gb300")
"""Systems whose NVLink domain spans the rack (MNNVL) and where vLLM's NVLink one-sided
all-to-all (`flashinfer_nvlink_one_sided`, the backend InferenceX's vLLM recipes there run)
is priced from a measurement: GB200's `trtllm_alltoall_perf`, and GB300 on GB200's fabric. The
search tries it beside the others on decode and aggregated instances, except where MegaMoE's
fused exchange runs."""


def build_space(model: str, hardware: str, gpus: int, *, engine: str = "vllm",
                precision: Precision | None = None, **choices: Any) -> SearchSpace:
    """The space for `model` on at most `gpus` GPUs of `hardware`; `choices` override the other
    SearchSpace fields (e.g. layouts=("pd",), max_num_seqs=(16, 64)). SpecError when nothing
    fits."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise SpecError(f"--gpus={gpus!r} must be a whole number of GPUs >= 1")
    spec, hw = load_model(model), load_hardware(hardware)
    precision = precision or native_precision(spec, hardware)
    mnbt = min(choices.get("max_num_batched_tokens", SearchSpace.max_num_batched_tokens))
    topology = Topology.build(hw, gpus)
    deps, redundant, why = [], {}, ""
    for dep in _dep_candidates(gpus, choices.pop("deps", None)):
        options = redundant_options(spec, dep)
        if not options:
            why = why or f"no redundant-expert count makes {spec.n_routed_experts} + R divisible"
            continue
        try:
            topology.place([InstanceRequest("instance-0", dep)])
            check_memory("instance", spec, hw, RoleSpec(dep=dep, redundant_experts=options[0],
                                                         max_num_batched_tokens=mnbt),
                         precision.weights, precision.kv_cache,
                         indexer=precision.indexer_cache, engine=engine)
        except SpecError as e:
            why = str(e)
            continue
        deps.append(dep)
        redundant[dep] = options
    if not deps:
        raise SpecError(f"{model} fits no DEP size on {gpus} x {hardware}: {why}")
    if "mtp_tokens" not in choices:
        choices["mtp_tokens"] = mtp_options(spec)
    if "mtp_acceptance" not in choices and spec.dspark_block:
        choices["mtp_acceptance"] = DSPARK_ACCEPTANCE
    if spec.engram_layers:  # vLLM runs no Engram layer micro-batched
        choices["dbo"] = (False,)
    if "all2all" not in choices and uses_mega_moe(spec.architecture, hardware,
                                                  RoleSpec(dep=8), precision.weights):
        choices["all2all"] = (None, *SearchSpace.all2all)
    elif "all2all" not in choices and engine == "vllm" and hardware in ONE_SIDED_SYSTEMS:
        choices["all2all"] = (*SearchSpace.all2all, "flashinfer_nvlink_one_sided")
    layouts = choices.get("layouts", LAYOUTS)
    bad = [x for x in layouts if x not in LAYOUTS]
    if bad or not layouts:
        raise SpecError(f"layouts={list(layouts)!r}; valid: {', '.join(LAYOUTS)}")
    if "pd" in layouts and 2 * deps[0] > gpus:
        layouts = tuple(x for x in layouts if x != "pd")
        if not layouts:
            raise SpecError(f"P/D needs two instances of at least DEP{deps[0]} but the budget "
                            f"is {gpus} GPUs")
    choices["layouts"] = tuple(layouts)
    return SearchSpace(model=model, hardware=hardware, gpus=gpus, deps=tuple(deps),
                       redundant=redundant, engine=engine, precision=precision, **choices)


DSPARK_ACCEPTANCE = 0.78
"""Assumed acceptance of each DSpark draft token: 3.51 tokens accepted per step with blocks of
5, InferenceX's reference acceptance length for DeepSeek-V4.1-Flash (thinking on)."""


def native_precision(model: ModelSpec, hardware: str = "") -> Precision:
    """The checkpoint's own: fp4 weights where its routed experts are stored in fp4 (e.g.
    DeepSeek-V4), else fp8; fp8 KV and indexer caches, but for DeepSeek-V4.1 on Blackwell,
    where vLLM's default (mega attention) stores fp4 records and the recipe MXFP4 index
    keys."""
    weights = "fp4" if model.expert_dtype == "fp4" else "fp8"
    if model.attention == "dsv41" and hardware.lower() in SM100_HARDWARE:
        return Precision(weights=weights, kv_cache="fp4", indexer_cache="fp4")
    return Precision(weights=weights)


def _dep_candidates(gpus: int, given: Any) -> list[int]:
    if given is not None:
        return sorted({int(d) for d in given if 1 <= int(d) <= gpus})
    return sorted({d for d in (1, 2, 4) if d <= gpus} | set(range(8, gpus + 1, 8)))


def redundant_options(model: ModelSpec, dep: int) -> tuple[int, ...]:
    """Redundant-expert counts for DEP `dep`: those up to a quarter of the routed experts that
    meet (routed + R) % dep == 0, thinned to 0, E/16, E/8 and E/4 plus the smallest valid one."""
    e = model.n_routed_experts
    if not model.is_moe:
        return (0,)
    valid = [r for r in range(0, e // 4 + 1) if experts_divide(e, r, dep)]
    if not valid:
        return ()
    nice = {0, e // 16, e // 8, e // 4}
    keep = {r for r in valid if r in nice} | {valid[0]}
    return tuple(sorted(keep))


def mtp_options(model: ModelSpec) -> tuple[int, ...]:
    """Draft tokens worth trying: 0 (off) and 1..3 where vLLM allows them for the model's MTP
    layers; 0, 3 and a whole block for DSpark layers (one pass drafts up to a block)."""
    m = model.mtp_layers
    if not m:
        return (0,)
    if model.dspark_block:
        return tuple(sorted({0, min(3, model.dspark_block), model.dspark_block}))
    return (0, *(k for k in (1, 2, 3) if mtp_tokens_fit(k, m)))


def suggest(trial: TrialLike, space: SearchSpace) -> Deployment:
    """Draw one deployment through `trial` (its params are exactly `enumerate_params`' keys),
    within the GPU budget: `deployment_from_params` of the drawn params, which the trial keeps
    as drawn even where the deployment is their repair."""
    params: dict[str, Any] = {}

    def cat(name: str, choices: tuple[Any, ...]) -> Any:
        params[name] = trial.suggest_categorical(name, list(choices))
        return params[name]

    layout = cat("layout", space.layouts)
    roles = ("prefill", "decode") if layout == "pd" else ("aggregated",)
    for role in roles:
        dep = cat(f"{role}_dep", space.deps)
        low, high = space.instance_range(role, dep)
        name = f"{role}_instances_dep{dep}"
        params[name] = trial.suggest_int(name, low, high)
        cat(f"{role}_redundant_dep{dep}", space.redundant[dep])
        if role != "decode":
            cat(f"{role}_max_num_batched_tokens", space.max_num_batched_tokens)
        if role != "prefill":
            cat(f"{role}_max_num_seqs", space.max_num_seqs)
            cat(f"{role}_mtp_tokens", space.mtp_tokens)
            cat(f"{role}_all2all", space.all2all)
        if len(space.dbo) > 1:
            cat(f"{role}_dbo", space.dbo)
    return deployment_from_params(space, params)


def deployment_from_params(space: SearchSpace, params: Mapping[str, Any]) -> Deployment:
    """The deployment a point of the space stands for: the point itself where it fits the GPU
    budget, else its repair to the nearest deployment that does (`pd_sizes`), so no drawn
    point is over the budget. A pure function of the params: the params a trial records stay as
    drawn, and the trial's deployment is their repair."""
    roles: dict[str, RoleSpec] = {}
    layout = params["layout"]
    names = ("prefill", "decode") if layout == "pd" else ("aggregated",)
    if layout == "pd":
        sizes = pd_sizes(space, params)
    else:
        dep = int(params["aggregated_dep"])
        sizes = {"aggregated": (dep, int(params[f"aggregated_instances_dep{dep}"]))}
    for role in names:
        dep, instances = sizes[role]
        drawn = int(params[f"{role}_dep"])
        redundant = int(params[f"{role}_redundant_dep{drawn}"])
        if dep != drawn:  # the drawn count may not be valid for the repaired DEP
            redundant = nearest(space.redundant[dep], redundant)
        fields: dict[str, Any] = {"instances": instances, "dep": dep,
                                  "redundant_experts": redundant}
        if role != "decode":
            fields["max_num_batched_tokens"] = int(params[f"{role}_max_num_batched_tokens"])
        if role != "prefill":
            fields["max_num_seqs"] = int(params[f"{role}_max_num_seqs"])
            fields["all2all_backend"] = params[f"{role}_all2all"]
            mtp = int(params[f"{role}_mtp_tokens"])
            if mtp:
                fields["speculative"] = Speculative(
                    method=draft_method(space.model), tokens=mtp,
                    acceptance=space.mtp_acceptance)
        backend = fields.get("all2all_backend") or DEFAULT_BACKEND[role]
        if params.get(f"{role}_dbo", space.dbo[0]) and backend in DBO_BACKENDS:
            fields["dbo"] = True
        roles[role] = RoleSpec(**fields)
    precision = {} if space.precision == Precision() else {"precision": space.precision}
    return Deployment(model=space.model, hardware=space.hardware, engine=space.engine,
                      **precision, **roles)


def draft_method(model: str) -> Literal["mtp", "dspark"]:
    """The speculative method of a model's own draft layers."""
    return "dspark" if load_model(model).dspark_block else "mtp"


def pd_sizes(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(DEP, instances) of prefill and decode for a P/D point, within the GPU budget.

    A point within the budget keeps its own; one over it is repaired, in this order:
    1. a prefill DEP with no room beside it for even the smallest decode DEP gives way to the
       largest DEP (on one instance) that leaves room for the drawn decode DEP, or, where that
       does not fit beside the smallest prefill either, for the largest decode DEP that does;
    2. a decode DEP that does not fit beside one prefill instance gives way to the largest DEP
       that does;
    3. prefill instances are cut to leave room for one decode instance, decode instances to
       what prefill leaves.
    Each result is itself a point within the budget (one `enumerate_params` lists), so the
    repair makes no such point unreachable, and it keeps as much of the drawn point as fits:
    the decode DEP shrinks only as far as one prefill instance needs, and prefill keeps every
    drawn instance that fits beside it (so the decode DEP is also the largest that fits in what
    prefill leaves)."""
    gpus, smallest = space.gpus, space.deps[0]
    prefill, decode = int(params["prefill_dep"]), int(params["decode_dep"])
    n_prefill = int(params[f"prefill_instances_dep{prefill}"])
    n_decode = int(params[f"decode_instances_dep{decode}"])
    if prefill + smallest > gpus:
        prefill = largest_dep(space, gpus - min(decode, largest_dep(space, gpus - smallest)))
        n_prefill = 1
    if prefill + decode > gpus:
        decode = largest_dep(space, gpus - prefill)
    n_prefill = min(n_prefill, (gpus - decode) // prefill)
    n_decode = min(n_decode, (gpus - prefill * n_prefill) // decode)
    return {"prefill": (prefill, n_prefill), "decode": (decode, n_decode)}


def adjacent_points(space: SearchSpace, params: Mapping[str, Any],
                    running: float | None = None) -> list[dict[str, Any]]:
    """The points one knob away from `params` (a point of `suggest`): each role's DEP, instance
    count, redundant experts, token and sequence limits, draft tokens, all-to-all backend and
    overlap moved to the next choice down and up, in that order, role by role. A new DEP takes
    the instance count and redundant experts nearest to the point's among its own choices;
    the layout and the load stay. Moves start from the deployed plan (`as_deployed`), and a
    move that deploys as the plan or as an earlier move is left out.

    `running`: the requests a decode (or aggregated) rank of the point holds, as the screen
    estimates them (its `decode_batch`, a mean). Where the sequence limit is above it, the
    limit hardly binds, and nor do the choices well above it: the move down goes to the choice
    nearest to `running` (in ratio; the smaller of a tie), where a limit starts to change
    what the ranks run, instead of a step along the plateau."""
    roles = ("prefill", "decode") if params["layout"] == "pd" else ("aggregated",)
    params = as_deployed(space, params)
    out: list[dict[str, Any]] = []

    def step(name: str, options: Sequence[Any], held: float | None = None) -> None:
        choices = list(options)
        if name not in params or params[name] not in choices:
            return
        i = choices.index(params[name])
        down = i - 1
        if held is not None and held > 0 and choices[i] > held and i > 0:
            down = min(range(i), key=lambda j: (abs(math.log(choices[j] / held)), choices[j]))
        for j in (down, i + 1):
            if 0 <= j < len(choices):
                out.append({**params, name: choices[j]})

    for role in roles:
        dep = int(params[f"{role}_dep"])
        deps = list(space.deps)
        if dep in deps:
            i = deps.index(dep)
            for j in (i - 1, i + 1):
                if not 0 <= j < len(deps) or not space.redundant[deps[j]]:
                    continue
                new = deps[j]
                low, high = space.instance_range(role, new)
                moved = {k: v for k, v in params.items()
                         if not k.startswith((f"{role}_instances_dep", f"{role}_redundant_dep"))}
                moved.update({f"{role}_dep": new,
                              f"{role}_instances_dep{new}": min(max(
                                  int(params[f"{role}_instances_dep{dep}"]), low), high),
                              f"{role}_redundant_dep{new}": nearest(
                                  space.redundant[new], int(params[f"{role}_redundant_dep{dep}"]))})
                out.append(moved)
        low, high = space.instance_range(role, dep)
        step(f"{role}_instances_dep{dep}", range(low, high + 1))
        step(f"{role}_redundant_dep{dep}", space.redundant.get(dep, ()))
        step(f"{role}_max_num_batched_tokens", space.max_num_batched_tokens)
        step(f"{role}_max_num_seqs", space.max_num_seqs,
             None if role == "prefill" else running)
        step(f"{role}_mtp_tokens", space.mtp_tokens)
        step(f"{role}_all2all", space.all2all)
        step(f"{role}_dbo", space.dbo)
    seen = {deployment_from_params(space, params).model_dump_json()}
    distinct = []
    for point in out:  # a move the budget repairs back, or onto another move, is one point
        key = deployment_from_params(space, point).model_dump_json()
        if key not in seen:
            seen.add(key)
            distinct.append(point)
    return distinct


Move = tuple[str, int]
"""A one-knob move: the knob (a role's DEP, instance count, redundant experts, or a limit, as
`knobs` names it) and its way, +1 up or -1 down."""


def knobs(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, Any]:
    """A point's knobs as deployed (`as_deployed`), a role's instance count and redundant
    experts named without the DEP they belong to (`prefill_instances`), so that two points of
    different DEP sizes compare knob by knob."""
    out = {}
    for name, value in as_deployed(space, params).items():
        role, _, rest = name.partition("_")
        for kind in ("instances", "redundant"):
            if rest.startswith(f"{kind}_dep"):
                name = f"{role}_{kind}"
        out[name] = value
    return out


def moved(space: SearchSpace, before: Mapping[str, Any],
          after: Mapping[str, Any]) -> Move | None:
    """The one ordered knob `before` -> `after` moved, and which way; None where several
    knobs moved, none did, or the knob has no order (the all-to-all backend, overlap). A DEP
    move carries its instances and redundant experts along (`adjacent_points`) and counts as a
    move of the DEP alone."""
    return _move(knobs(space, before), knobs(space, after))


def _move(a: Mapping[str, Any], b: Mapping[str, Any]) -> Move | None:
    """`moved` between two points' knobs (`knobs`)."""
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    deps = [k for k in changed if k.endswith("_dep")]
    if len(deps if deps else changed) != 1:
        return None
    name = (deps or changed)[0]
    x, y = a.get(name), b.get(name)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (x, y)):
        return None
    return name, 1 if y > x else -1  # type: ignore[operator]


def continued(space: SearchSpace, before: Mapping[str, Any], after: Mapping[str, Any],
              running: float | None = None) -> dict[str, Any] | None:
    """The neighbour of `after` (`adjacent_points`) one more step of the move that led from
    `before` to it: the same knob the same way (None where the move was not one ordered knob
    or the knob is at its end)."""
    at = knobs(space, after)
    move = _move(knobs(space, before), at)
    if move is None:
        return None
    return next((p for p in adjacent_points(space, after, running)
                 if _move(at, knobs(space, p)) == move), None)


def as_deployed(space: SearchSpace, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with each role's DEP, instances and redundant experts those of the deployment
    they stand for (`deployment_from_params` repairs a drawn point to the GPU budget), so that
    moving one knob moves it from where the plan is."""
    deployment = deployment_from_params(space, params)
    out = {k: v for k, v in params.items()
           if not k.startswith(tuple(f"{r}_{f}_dep" for r in deployment.roles
                                     for f in ("instances", "redundant")))}
    for role, spec in deployment.roles.items():
        dep = int(spec.dep or 1)
        out.update({f"{role}_dep": dep, f"{role}_instances_dep{dep}": spec.instances,
                    f"{role}_redundant_dep{dep}": spec.redundant_experts})
    return out


def nearest(options: tuple[int, ...], value: int) -> int:
    """The option closest to `value` (the smaller one of a tie)."""
    return min(options, key=lambda o: (abs(o - value), o))


def largest_dep(space: SearchSpace, gpus: int) -> int:
    """The largest DEP size of the space on at most `gpus` GPUs (the smallest where none fits)."""
    return max((d for d in space.deps if d <= gpus), default=space.deps[0])


def enumerate_params(space: SearchSpace) -> Iterator[dict[str, Any]]:
    """Every point of the space within the GPU budget (for exhaustive search on small spaces)."""
    for layout in space.layouts:
        roles = ("prefill", "decode") if layout == "pd" else ("aggregated",)
        per_role = [list(_role_points(space, role)) for role in roles]
        for combo in itertools.product(*per_role):
            gpus = sum(p[f"{r}_dep"] * p[f"{r}_instances_dep{p[f'{r}_dep']}"]
                       for r, p in zip(roles, combo, strict=True))
            if gpus <= space.gpus:
                yield {"layout": layout, **{k: v for p in combo for k, v in p.items()}}


def _role_points(space: SearchSpace, role: str) -> Iterator[dict[str, Any]]:
    for dep in space.deps:
        low, high = space.instance_range(role, dep)
        mnbt = space.max_num_batched_tokens if role != "decode" else (None,)
        seqs = space.max_num_seqs if role != "prefill" else (None,)
        mtp = space.mtp_tokens if role != "prefill" else (None,)
        a2a = space.all2all if role != "prefill" else (None,)
        dbo = space.dbo if len(space.dbo) > 1 else (None,)
        for n, r, t, s, k, b, o in itertools.product(range(low, high + 1),
                                                      space.redundant[dep], mnbt, seqs, mtp,
                                                      a2a, dbo):
            point: dict[str, Any] = {f"{role}_dep": dep, f"{role}_instances_dep{dep}": n,
                                     f"{role}_redundant_dep{dep}": r}
            if t is not None:
                point[f"{role}_max_num_batched_tokens"] = t
            if s is not None:
                point[f"{role}_max_num_seqs"] = s
                point[f"{role}_mtp_tokens"] = k
                point[f"{role}_all2all"] = b
            if o is not None:
                backend = b or DEFAULT_BACKEND[role]
                if o and backend not in DBO_BACKENDS:
                    continue  # the same deployment as dbo off
                point[f"{role}_dbo"] = o
            yield point


def check(deployment: Deployment, space: SearchSpace,
          calibration: Calibration | None = None,
          overhead: ServingOverhead | None = None) -> Resolved:
    """The resolved deployment, or SpecError saying why it cannot run: over the GPU budget,
    a vLLM rule, memory, or topology."""
    used = deployment.gpus_used
    if used > space.gpus:
        parts = ", ".join(f"{name} {r.instances} x {r.layout}"
                          for name, r in deployment.roles.items())
        raise SpecError(f"uses {used} GPUs ({parts}) but the budget is {space.gpus}")
    return resolve(deployment, calibration, overhead=overhead)


def deployment_key(deployment: Deployment) -> str:
    """A stable text key of a deployment (equal deployments, equal keys)."""
    return deployment.model_dump_json()
