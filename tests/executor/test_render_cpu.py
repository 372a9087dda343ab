"""executor/render on the cpu hardware: flags vLLM's CPU build can run (golden file, roles)."""

import json
from pathlib import Path

import pytest

from executor.engines.vllm import CPU_MAX_MODEL_LEN
from executor.render import render
from simulator.specs.errors import SpecError
from simulator.specs.loading import load_deployment
from tests.executor.golden_files import assert_golden, command_lines
from tests.executor.local_helpers import TINY_AGG, TINY_PD, plan_deployment

ROOT = Path(__file__).resolve().parents[2]


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_tiny_moe_cpu_pd_plan_matches_its_golden_file():
    r = render(plan_deployment(TINY_PD), model_path="/models/tiny-moe")
    assert_golden("tiny-moe-cpu-pd.txt", command_lines(r))


def test_cpu_pd_roles_hand_kv_over_a_shared_folder_with_explicit_roles():
    r = render(plan_deployment(TINY_PD), kv_dir="/run/kv")
    configs = {p.role: json.loads(flag(p.argv, "--kv-transfer-config") or "{}")
               for p in r.processes}
    assert configs == {role: {"kv_connector": "ExampleConnector", "kv_role": kv_role,
                              "kv_connector_extra_config": {"shared_storage_path": "/run/kv"}}
                       for role, kv_role in (("prefill", "kv_producer"),
                                             ("decode", "kv_consumer"))}
    for p in r.processes:
        assert p.env == {}  # no NIXL side channel
        assert "--enforce-eager" in p.argv and "--compilation-config" not in p.argv
        assert "--gpu-memory-utilization" not in p.argv
        assert int(flag(p.argv, "--kv-cache-memory-bytes") or 0) > 0
    assert r.router == {"port": 8099, "prefill_urls": ["http://host0:8100"],
                        "decode_urls": ["http://host1:8101"],
                        "prefill_policy": "prefix_aware", "decode_policy": "least_requests"}


def test_cpu_pd_roles_run_each_prompt_in_one_step():
    """ExampleConnector saves a prompt's KV at its first step: no chunked prefill on P/D, and
    so a context no longer than one step's token budget (the aggregated role keeps both)."""
    r = render(plan_deployment(TINY_PD))
    for p in r.processes:
        assert "--no-enable-chunked-prefill" in p.argv
        assert flag(p.argv, "--max-model-len") == flag(p.argv, "--max-num-batched-tokens")
    shorter = render(plan_deployment(TINY_PD), max_model_len=256)
    assert {flag(p.argv, "--max-model-len") for p in shorter.processes} == {"256"}
    (agg,) = render(plan_deployment(TINY_AGG)).processes
    assert "--no-enable-chunked-prefill" not in agg.argv
    assert flag(agg.argv, "--max-model-len") == str(CPU_MAX_MODEL_LEN)


def test_cpu_aggregated_has_no_connector():
    (p,) = render(plan_deployment(TINY_AGG), max_model_len=512).processes
    assert "--kv-transfer-config" not in p.argv and flag(p.argv, "--max-model-len") == "512"


def test_gpu_rendering_keeps_cuda_graphs_and_nixl():
    r = render(load_deployment(ROOT / "examples" / "deepseek-v3-h200-pd.yaml"))
    for p in r.processes:
        assert "--enforce-eager" not in p.argv and "--max-model-len" not in p.argv
        assert "NixlConnector" in (flag(p.argv, "--kv-transfer-config") or "")
        assert "VLLM_NIXL_SIDE_CHANNEL_PORT" in p.env


def test_max_model_len_must_be_positive():
    with pytest.raises(SpecError, match="max_model_len=0 must be >= 1"):
        render(plan_deployment(TINY_AGG), max_model_len=0)


def test_local_cpu_instances_get_their_own_cores():
    from executor.backends.local import CPU_BIND_ENV, bind_cores, render_local

    rendered = render_local(plan_deployment(TINY_PD))
    bound = bind_cores(rendered, [0, 1])
    assert [p.env[CPU_BIND_ENV] for p in bound.processes] == ["0", "1"]
    four = bind_cores(rendered, [0, 1, 2, 3])
    assert [p.env[CPU_BIND_ENV] for p in four.processes] == ["0-1", "2-3"]
    shared = bind_cores(rendered, [5])
    assert [p.env[CPU_BIND_ENV] for p in shared.processes] == ["5", "5"]
    odd = bind_cores(rendered, [0, 2, 4, 6])
    assert [p.env[CPU_BIND_ENV] for p in odd.processes] == ["0,2", "4,6"]
    assert CPU_BIND_ENV in render_local(plan_deployment(TINY_PD)).processes[0].env
    one = render_local(plan_deployment(TINY_AGG))  # one engine: the first core left free
    assert [p.env[CPU_BIND_ENV] for p in bind_cores(one, [0, 1]).processes] == ["1"]
    assert [p.env[CPU_BIND_ENV] for p in bind_cores(one, [0, 1, 2, 3]).processes] == ["1-3"]
    assert bind_cores(one, [5]) == one  # a single core: nothing to leave free


def test_a_pinned_engine_is_pinned_whole_and_the_client_stays_off_the_decode_core(tmp_path):
    """vLLM's CPU worker busy-polls for a second after each step, so each engine (API server,
    engine core and worker) runs on its own cores, and the router and benchmark client beside
    the prefill engine, not on the decode engine's core; beside a single engine, on the core
    it leaves free."""
    import os
    import subprocess
    import sys

    from executor.backends.local import (
        LocalBackend,
        bind_cores,
        bound_cores,
        client_cores,
        local_client_cores,
        pinned,
        render_local,
    )

    assert bound_cores({"VLLM_CPU_OMP_THREADS_BIND": "0"}) == (0,)
    assert bound_cores({"VLLM_CPU_OMP_THREADS_BIND": "2-3"}) == (2, 3)
    assert bound_cores({"VLLM_CPU_OMP_THREADS_BIND": "0,2"}) == (0, 2)
    assert bound_cores({"VLLM_CPU_OMP_THREADS_BIND": "0-1|4-5"}) == (0, 1, 4, 5)
    assert bound_cores({}) is None and bound_cores({"VLLM_CPU_OMP_THREADS_BIND": "auto"}) is None

    rendered = bind_cores(render_local(plan_deployment(TINY_PD)), [0, 1])
    assert client_cores(rendered) == (0,)
    backend = LocalBackend(rendered, tmp_path / "run", vllm=tmp_path / "vllm")
    lines = backend.dry_run_lines()
    assert [line.split(" taskset -c ")[1].split()[0] for line in lines] == ["0", "1"]
    commands = backend.render()[0].read_text()
    assert commands.count("setsid taskset -c ") == 2
    assert "taskset -c 0 " in commands.splitlines()[-2]  # the router

    pd, agg = plan_deployment(TINY_PD), plan_deployment(TINY_AGG)
    here = sorted(os.sched_getaffinity(0))
    assert local_client_cores(pd, "http://127.0.0.1:8099") == (here[0],)
    assert local_client_cores(pd, "http://10.0.0.5:8099") is None  # not this machine's
    if len(here) > 1:  # one engine on the other cores, the router and client on the first
        assert local_client_cores(agg, "http://127.0.0.1:8099") == (here[0],)
        (engine,) = render_local(agg).processes
        assert bound_cores(engine.env) == tuple(here[1:])

    before = os.sched_getaffinity(0)
    with pinned((here[-1],)):
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted("
                                "os.sched_getaffinity(0)))"], capture_output=True, text=True,
                               check=True)
    assert child.stdout.strip() == f"[{here[-1]}]"
    assert os.sched_getaffinity(0) == before
