"""A deployment rendered as typed launch records: one per host process of each instance.

A DEP-N instance spans ceil(N x TP / GPUs per host) hosts: the first is the head (it serves the
API and owns the data-parallel RPC port), the others are headless with their slice of
data-parallel ranks. What each process runs (its flags, its environment) comes from the engine
the deployment names (executor/engines/, refused by name when rackplan does not deploy it); the
router (our P/D proxy) gets the URLs of every instance and the plan's router policy of each role.
Records stay data: their command line is `to_argv()`, the last step (executor/records.py).
Rendering is pure: no process is started and nothing is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from executor.engines import engine_for
from executor.engines.vllm import CPU_KV_DIR, CPU_MAX_MODEL_LEN
from executor.records import DataParallel, LaunchRecord, Rendered
from simulator.specs.deployment import Deployment, RoleSpec
from simulator.specs.errors import SpecError
from simulator.specs.hardware import load_hardware


def render(deployment: Deployment, model_path: str | None = None, base_port: int = 8100,
           rpc_base_port: int = 29550, hosts: Sequence[str] | str | None = None,
           kv_dir: str = CPU_KV_DIR, max_model_len: int = CPU_MAX_MODEL_LEN) -> Rendered:
    """The processes of `deployment`. `model_path` is what the engine serves (default: the
    model field); `hosts` names the machines in placement order (default host0, host1, ...), or
    is one name for every host (a single machine). On the cpu hardware, `kv_dir` is
    ExampleConnector's shared folder and `max_model_len` the engine's context limit."""
    engine = engine_for(deployment)
    engine.check(deployment)
    if max_model_len < 1:
        raise SpecError(f"max_model_len={max_model_len} must be >= 1")
    per_host = load_hardware(deployment.hardware).gpus_per_host
    model = model_path or deployment.model
    records: list[LaunchRecord] = []
    next_host, port, rpc, ordinal = 0, base_port, rpc_base_port, 0
    urls: dict[str, list[str]] = {}
    for role_name, role in deployment.roles.items():
        flags = engine.role_flags(deployment, role_name, role, kv_dir=kv_dir,
                                  max_model_len=max_model_len)
        n_hosts = math.ceil(role.ranks / per_host)
        for i in range(role.instances):
            head = _host(hosts, next_host)
            urls.setdefault(role_name, []).append(f"http://{head}:{port}")
            for h in range(n_hosts):
                records.append(LaunchRecord(
                    instance=f"{role_name}-{i}", role=role_name, host=h, model=model,
                    flags=flags, tp=role.tp or 1,
                    dp=_data_parallel(role, h, per_host, head, rpc),
                    port=port if h == 0 else None,
                    env=engine.env(deployment, role_name, _host(hosts, next_host + h), ordinal),
                    launcher=engine.launcher))
            next_host += n_hosts
            port += 1
            rpc += 1
            ordinal += 1
    router: dict[str, object] = {"port": base_port - 1, **{
        f"{r}_urls": u for r, u in urls.items()}, **{
        f"{r}_policy": role.router_policy(r) for r, role in deployment.roles.items()}}
    return Rendered(tuple(records), router)


def _data_parallel(role: RoleSpec, host: int, per_host: int, head: str,
                   rpc_port: int) -> DataParallel | None:
    """Host `host`'s slice of a DEP instance's ranks (each rank a TP group of tp GPUs); None
    without data parallelism."""
    if role.dep is None or role.dep <= 1:
        return None
    tp = role.attention_tp
    gpus = min(per_host, role.ranks - host * per_host)
    return DataParallel(size=role.dep, local=gpus // tp, start_rank=host * per_host // tp,
                        address=head, rpc_port=rpc_port, headless=host > 0)


def _host(hosts: Sequence[str] | str | None, index: int) -> str:
    if hosts is None:
        return f"host{index}"
    if isinstance(hosts, str):
        return hosts
    if index >= len(hosts):
        raise SpecError(f"the deployment needs more than the {len(hosts)} hosts given")
    return hosts[index]


__all__ = ["DataParallel", "LaunchRecord", "Rendered", "render"]
