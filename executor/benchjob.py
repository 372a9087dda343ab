"""A Kubernetes Job that measures a deployment: `vllm bench serve` against its router.

`bench_job` builds a batch/v1 Job (a plain dict, ready for YAML) whose one container runs
executor/bench.py's `bench_command` for the plan's workload — the very arguments `rackplan
bench` runs locally, written in one place — against the router's URL. The benchmark saves its
JSON as /results/bench.json, on a PersistentVolumeClaim when `results_claim` names one (else on
the pod's own emptyDir), and the container then prints `result: /results/bench.json` and the
JSON itself, so `kubectl logs job/NAME` holds the result either way. `rackplan bench PLAN
--from-file bench.json` compares it with the plan's prediction.

A workload with a sessions (AgentX) arrival is refused in one line: it is measured with aiperf's
agentx scenario, which a bench Job does not run yet (`rackplan bench --from-file` reads aiperf's
summary, profile_export_aiperf.json, when it was run by hand).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from executor.backends.layout import dns_label
from executor.bench import RESULT_FILE, bench_command, bench_settings
from simulator.specs.deployment import Deployment
from simulator.specs.errors import SpecError
from simulator.specs.model import HF_PRESETS
from simulator.specs.workload import SessionsArrival, Workload

RESULT_DIR = "/results"
"""Where the container saves the benchmark's JSON (the results volume's mount)."""
CONTAINER = "bench"
SHOW_RESULT = (f'"$@" && echo "result: {RESULT_DIR}/{RESULT_FILE}" && '
               f'cat "{RESULT_DIR}/{RESULT_FILE}" && echo')
"""The container's shell: run the benchmark (its words are the arguments, never re-quoted),
then print where the result is and the result."""
AIPERF_MISSING = (
    "a sessions (AgentX) arrival is measured with aiperf's agentx scenario, which a bench Job "
    "does not run yet (missing: an image with aiperf, and the plan's session corpus as an "
    "aiperf dataset); run aiperf yourself and compare its profile_export_aiperf.json with "
    "`rackplan bench PLAN --from-file`, or give a closed, poisson or bursty arrival")
"""Why a sessions workload gets no Job."""


def bench_job(plan: str | Path | tuple[Deployment, Workload], router_url: str, name: str,
              image: str, *, model: str | None = None, tokenizer: str | None = None,
              num_prompts: int | None = None, namespace: str | None = None,
              results_claim: str | None = None,
              hf_token_secret: str | None = None) -> dict[str, Any]:
    """A batch/v1 Job that runs `vllm bench serve` with the plan's workload against the router.

    plan: a plan.yaml or deployment YAML path (its workload, else the default one), or a
        (deployment, workload) pair.
    router_url: where the Job's pod reaches the router, e.g. http://NAME-router:8099.
    name: the Job's name, a DNS label (lowercase letters, digits, dashes).
    image: an image with `vllm` on its PATH (the engine pods' image serves).
    model: the model name the deployment serves (default: the preset's Hugging Face id, else
        the deployment's model as given; pass the path when the pods serve a folder).
    tokenizer: where the benchmark reads the tokenizer (default: `model`).
    num_prompts: prompts to send instead of the workload's request count.
    namespace: the Job's namespace (default: kubectl's current one).
    results_claim: a PersistentVolumeClaim to save the result on (default: an emptyDir; the
        result is printed to the log in both cases).
    hf_token_secret: a Secret whose HF_TOKEN key the benchmark may read (optional there).

    SpecError, in one sentence, for a name that is not a DNS label, a workload the benchmark
    cannot send (including a sessions arrival, see AIPERF_MISSING) or a bad prompt count.
    """
    if name != dns_label(name, limit=63):
        raise SpecError(f"bench job name {name!r} is not a DNS label; use lowercase letters, "
                        f"digits and dashes, e.g. {dns_label(name, limit=63)!r}")
    deployment, workload = _plan(plan)
    if isinstance(workload.arrival, SessionsArrival):
        raise SpecError(AIPERF_MISSING)
    served = model or {preset: hf for hf, preset in HF_PRESETS.items()}.get(
        deployment.model, deployment.model)
    argv = bench_command(bench_settings(workload, num_prompts), router_url, served, RESULT_DIR,
                         tokenizer=tokenizer)
    labels = {"app.kubernetes.io/name": "rackplan-bench", "app.kubernetes.io/instance": name}
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image, "command": ["/bin/sh", "-c", SHOW_RESULT, "bench"],
        "args": argv, "volumeMounts": [{"name": "results", "mountPath": RESULT_DIR}],
        "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}
    if hf_token_secret is not None:
        container["env"] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": hf_token_secret, "key": "HF_TOKEN", "optional": True}}}]
    volume: dict[str, Any] = ({"persistentVolumeClaim": {"claimName": results_claim}}
                              if results_claim is not None else {"emptyDir": {}})
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": dict(labels)},
            "spec": {"restartPolicy": "Never", "containers": [container],
                     "volumes": [{"name": "results", **volume}]}}}}


def _plan(plan: str | Path | tuple[Deployment, Workload]) -> tuple[Deployment, Workload]:
    if isinstance(plan, tuple):
        return plan
    from planner.plan import load_plan_or_deployment

    deployment, workload = load_plan_or_deployment(plan)
    return deployment, workload or Workload()


__all__ = ["AIPERF_MISSING", "RESULT_DIR", "bench_job"]
