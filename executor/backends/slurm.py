"""Slurm: one sbatch job array per role; the router on the first instance's head node.

Each role becomes `<role>.sbatch`: a job array with one task per instance, each task holding
`--nodes` = hosts of one instance with one task and all GPUs per node. The task names its first
node the head (`scontrol show hostnames`), records the instance's URL under endpoints/, and
starts `<role>-node.sh` on every node with `srun`; that script picks the node's own command by
`SLURM_NODEID` — node 0 the head's `vllm serve`, node k the headless one with its slice of
data-parallel ranks — with the head's address and the node's own host name filled in. Commands
and environments come from the launch records' fields (`shell_words`), never from a command
line read back. A process that hands KV blocks over with NIXL (a P/D role on GPUs) also gets
UCX's settings: `UCX_TLS` (RDMA between nodes, shared memory and CUDA IPC inside one, TCP as
the fallback; $RACKPLAN_UCX_TLS replaces it) and `UCX_NET_DEVICES` ($RACKPLAN_UCX_NET_DEVICES,
e.g. mlx5_0:1,mlx5_1:1; UCX's `all` when unset), and its NIXL side channel listens on the
node's own host name.

The first role's first array task (prefill-0, or aggregated-0) also runs `router.sh` on its
head node, beside its engine: it waits for every instance's URL, writes router.json (with the
plan's router policies), records its own URL in router.url and runs our P/D proxy; the task
ends when either the engine or the router does. The run directory must be on a file system that
the login node and the compute nodes share, and `vllm` (or $VLLM) and rackplan's `python` (or
$PYTHON) must be on the nodes' PATH.

`render` writes the scripts under <run_dir>/slurm/; `launch` submits the role scripts with
sbatch, `wait_ready` waits for router.url and one completion through it, `teardown` cancels the
submitted jobs.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from executor.backends.base import Backend, LaunchError, write_atomic
from executor.backends.layout import HOST_ENV, RoleLayout, dns_label, role_layouts, shell_lines
from executor.records import LaunchRecord, Rendered

SCRIPT_DIR = "slurm"
"""Folder under the run directory that holds the scripts; jobs run in it."""
ENDPOINT_WAIT_S = 3600
"""How long the router waits for the instances' URLs ($RACKPLAN_ENDPOINT_WAIT_S overrides it)."""
POLL_S = 5.0
ROUTER_SCRIPT = "router.sh"
"""The router's script, run by the first role's first array task on its head node."""
UCX_TLS = "rc,sm,cuda_ipc,cuda_copy,tcp"
"""UCX transports of a NIXL process unless $RACKPLAN_UCX_TLS says otherwise: RDMA between
nodes, shared memory and CUDA IPC inside one, TCP as the fallback."""
UCX_ENV = {"UCX_TLS": f"${{RACKPLAN_UCX_TLS:-{UCX_TLS}}}",
           "UCX_NET_DEVICES": "${RACKPLAN_UCX_NET_DEVICES:-all}"}
"""UCX's settings of a NIXL process, as shell expressions of the documented variables
($RACKPLAN_UCX_NET_DEVICES names the NICs NIXL may use, e.g. mlx5_0:1,mlx5_1:1)."""


class SlurmBackend(Backend):
    """A rendered deployment as sbatch scripts, submitted with sbatch."""

    name: ClassVar[str] = "slurm"

    def __init__(self, rendered: Rendered, run_dir: Path, *, app: str | None = None) -> None:
        super().__init__(rendered, run_dir)
        self.app = dns_label(app or Path(run_dir).name.removeprefix("deploy-"), limit=40)
        """Prefix of every job name."""
        self.layouts = role_layouts(rendered)
        self.jobs: list[tuple[str, str]] = []
        """(what, job id) of every submitted job."""

    @property
    def folder(self) -> Path:
        return self.run_dir / SCRIPT_DIR

    @property
    def url(self) -> str | None:
        """The router's URL once it has written it, else None."""
        path = self.folder / "router.url"
        return path.read_text(encoding="utf-8").strip() if path.is_file() else None

    # --- scripts -------------------------------------------------------------------------

    @property
    def router_role(self) -> str:
        """The role whose first instance's head node runs the router (the first role)."""
        return self.layouts[0].role

    def role_script(self, layout: RoleLayout) -> str:
        """The sbatch script of one role: a job array, one task per instance; the router
        role's task 0 also runs the router on its head node."""
        gpus = f"#SBATCH --gpus-per-node={layout.gpus_per_host}\n" if layout.gpus_per_host else ""
        node = f"{layout.role}-node.sh"
        srun = (f"STEP=(srun --nodes={layout.hosts} --ntasks={layout.hosts} --ntasks-per-node=1 "
                f'--kill-on-bad-exit=1 bash {node} "$HEAD")\n')
        if layout.role == self.router_role:
            start = ('if [[ "${SLURM_ARRAY_TASK_ID:-0}" == 0 ]]; then\n'
                     "  # the router, on this head node beside its engine; the task ends with "
                     "either\n"
                     f"  bash {ROUTER_SCRIPT} > logs/router.out 2>&1 &\n"
                     "  trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
                     '  "${STEP[@]}" &\n'
                     "  wait -n\n"
                     "else\n"
                     '  exec "${STEP[@]}"\n'
                     "fi\n")
        else:
            start = 'exec "${STEP[@]}"\n'
        return (
            "#!/bin/bash\n"
            f"# rackplan {self.app}: {layout.instances} {layout.role} instance(s) of "
            f"{layout.hosts} node(s), one array task per instance.\n"
            f"#SBATCH --job-name={self.app}-{layout.role}\n"
            f"#SBATCH --array=0-{layout.instances - 1}\n"
            f"#SBATCH --nodes={layout.hosts}\n"
            "#SBATCH --ntasks-per-node=1\n"
            f"{gpus}"
            "#SBATCH --exclusive\n"
            "#SBATCH --output=logs/%x-%a.out\n"
            "set -euo pipefail\n"
            'cd "${SLURM_SUBMIT_DIR:-.}"\n'
            f'INSTANCE="{layout.role}-${{SLURM_ARRAY_TASK_ID:-0}}"\n'
            'HEAD="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"\n'
            "mkdir -p endpoints\n"
            f"printf 'http://%s:%s\\n' \"$HEAD\" {layout.port} > \"endpoints/$INSTANCE.url.tmp\"\n"
            'mv "endpoints/$INSTANCE.url.tmp" "endpoints/$INSTANCE.url"\n'
            f"{srun}{start}")

    def node_script(self, layout: RoleLayout) -> str:
        """The per-node script of one role: node k runs host k's command."""
        lines = [
            "#!/bin/bash",
            f"# rackplan {self.app}: one node of a {layout.role} instance, started by srun "
            "on every node; SLURM_NODEID picks its command.",
            "set -euo pipefail",
            'HEAD="${1:?usage: bash ' + f'{layout.role}-node.sh HEAD_HOST}}"',
            'SELF="$(hostname)"',
            'case "${SLURM_NODEID:?run under srun}" in']
        for proc in layout.processes:
            lines.append(f"  {proc.host})")
            lines += [f"    export {line}" for line in _env_lines(proc)]
            lines.append("    " + shell_lines(["exec", *_command(proc)], indent="      "))
            lines.append("    ;;")
        lines += [f'  *) echo "SLURM_NODEID=$SLURM_NODEID is not a node of this {layout.hosts}'
                  '-node instance" >&2; exit 1 ;;',
                  "esac"]
        return "\n".join(lines) + "\n"

    def router_script(self) -> str:
        """The router, run on the head node of the router role's first instance: wait for every
        instance's URL, write router.json (with the plan's router policies), record its own
        URL, run the proxy."""
        names = [f"{layout.role}-{i}" for layout in self.layouts
                 for i in range(layout.instances)]
        keys = [f'\\"{layout.role}_urls\\": [%s]' for layout in self.layouts] + [
            f'\\"{key}\\": \\"{policy}\\"'
            for key, policy in self.rendered.router_policies.items()]
        lists = " ".join('"$(urls ' + " ".join(f"{layout.role}-{i}" for i in
                                                range(layout.instances)) + ')"'
                         for layout in self.layouts)
        return (
            "#!/bin/bash\n"
            f"# rackplan {self.app}: the P/D router, started by {self.router_role}-0's batch "
            "script on its head node.\n"
            "set -euo pipefail\n"
            f"WAIT_S=${{RACKPLAN_ENDPOINT_WAIT_S:-{ENDPOINT_WAIT_S}}}\n"
            "SECONDS=0\n"
            f"for INSTANCE in {' '.join(names)}; do\n"
            '  until [[ -s "endpoints/$INSTANCE.url" ]]; do\n'
            '    if (( SECONDS > WAIT_S )); then\n'
            '      echo "no URL from $INSTANCE after $WAIT_S s" >&2; exit 1\n'
            "    fi\n"
            "    sleep 2\n"
            "  done\n"
            "done\n"
            "urls() {\n"
            '  local sep=""\n'
            '  for name in "$@"; do\n'
            '    printf \'%s"%s"\' "$sep" "$(cat "endpoints/$name.url")"\n'
            '    sep=", "\n'
            "  done\n"
            "}\n"
            f'printf "{{\\"port\\": %d, \\"host\\": \\"0.0.0.0\\", {", ".join(keys)}}}\\n" '
            f"{self.router_port} {lists} > router.json.tmp\n"
            "mv router.json.tmp router.json\n"
            f"printf 'http://%s:%d\\n' \"$(hostname)\" {self.router_port} > router.url.tmp\n"
            "mv router.url.tmp router.url\n"
            'exec "${PYTHON:-python}" -m executor.proxy --config router.json\n')

    # --- Backend -------------------------------------------------------------------------

    def render(self) -> list[Path]:
        """<role>.sbatch and <role>-node.sh per role, and router.sh, under <run_dir>/slurm/
        (with its logs/ folder, which Slurm does not create)."""
        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        files = []
        for layout in self.layouts:
            files.append(write_atomic(self.folder / f"{layout.role}.sbatch",
                                      self.role_script(layout), 0o755))
            files.append(write_atomic(self.folder / f"{layout.role}-node.sh",
                                      self.node_script(layout), 0o755))
        files.append(write_atomic(self.folder / ROUTER_SCRIPT, self.router_script(), 0o755))
        return files

    def _sbatch(self, *args: str) -> str:
        sbatch = shutil.which("sbatch")
        if sbatch is None:
            raise LaunchError("sbatch not found on PATH; use --dry-run to write the batch "
                              f"scripts to {self.folder}")
        run = subprocess.run([sbatch, "--parsable", *args], cwd=self.folder,
                             capture_output=True, text=True, timeout=120, check=False)
        if run.returncode:
            raise LaunchError(f"sbatch {args[-1]} failed: {_last_line(run)}")
        return run.stdout.strip().split(";")[0]

    def launch(self) -> None:
        """Submit every role's job array (the router starts inside the first)."""
        if shutil.which("sbatch") is None:
            raise LaunchError("sbatch not found on PATH; use --dry-run to write the batch "
                              f"scripts to {self.folder}")
        self.render()
        for stale in [*self.folder.glob("endpoints/*.url"), self.folder / "router.url"]:
            stale.unlink(missing_ok=True)
        for layout in self.layouts:
            self.jobs.append((layout.role, self._sbatch(f"{layout.role}.sbatch")))
        write_atomic(self.folder / "jobs.json", json.dumps(dict(self.jobs), indent=2) + "\n")

    def wait_ready(self, timeout_s: float) -> None:
        """Until the router has written its URL and a completion through it succeeds; a job
        that leaves the queue first is a LaunchError naming it."""
        deadline = time.monotonic() + timeout_s
        model = self.layouts[-1].model
        while time.monotonic() < deadline:
            gone = self._ended_jobs()
            if gone:
                raise LaunchError(f"slurm job {gone[0][1]} ({gone[0][0]}) ended before the "
                                  f"deployment was ready; see {self.folder / 'logs'}")
            url = self.url
            if url and _completion(url, model):
                return
            time.sleep(POLL_S)
        raise LaunchError(f"the deployment was not ready within {timeout_s:.0f} s; see "
                          f"{self.folder / 'logs'}")

    def _ended_jobs(self) -> list[tuple[str, str]]:
        squeue = shutil.which("squeue")
        if squeue is None or not self.jobs:
            return []
        run = subprocess.run([squeue, "--noheader", "--format=%i",
                              f"--jobs={','.join(job for _, job in self.jobs)}"],
                             capture_output=True, text=True, timeout=60, check=False)
        if run.returncode:
            return []
        queued = {line.split("_")[0].strip() for line in run.stdout.splitlines()}
        return [(what, job) for what, job in self.jobs if job not in queued]

    def teardown(self) -> None:
        """scancel every submitted job; safe to call twice."""
        jobs, self.jobs = self.jobs, []
        scancel = shutil.which("scancel")
        if jobs and scancel is not None:
            subprocess.run([scancel, *(job for _, job in jobs)], capture_output=True,
                           timeout=60, check=False)


def uses_nixl(proc: LaunchRecord) -> bool:
    """Whether the process hands KV blocks over with NIXL: its --kv-transfer-config names
    NixlConnector, alone or among a MultiConnector's connectors."""
    config = proc.value("--kv-transfer-config")
    if not isinstance(config, Mapping):
        return False
    extra = config.get("kv_connector_extra_config")
    inner = extra.get("connectors") if isinstance(extra, Mapping) else None
    configs = [config, *(inner if isinstance(inner, list) else [])]
    return any(isinstance(c, Mapping) and c.get("kv_connector") == "NixlConnector"
               for c in configs)


def _env_lines(proc: LaunchRecord) -> list[str]:
    """NAME=value assignments of a process's environment: its own host name from $SELF, and
    UCX's settings for a NIXL process (UCX_ENV) unless the record gives them."""
    lines = [f'{key}="$SELF"' if key in HOST_ENV else f"{key}={shlex.quote(value)}"
             for key, value in sorted(proc.env.items())]
    if uses_nixl(proc):
        lines += [f'{key}="{expr}"' for key, expr in UCX_ENV.items() if key not in proc.env]
    return lines


def _command(proc: LaunchRecord) -> list[str]:
    """The process's command as shell words: the head's address from $HEAD, the executable
    overridable with $VLLM."""
    exe = proc.launcher[0]
    plain = all(c.isalnum() or c in "_./-" for c in exe)
    return proc.shell_words(executable=f'"${{VLLM:-{exe}}}"' if plain else None,
                            dp={"address": "$HEAD"})


def _completion(url: str, model: str) -> bool:
    """Whether one completion through `url` succeeds."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _last_line(run: subprocess.CompletedProcess[str]) -> str:
    lines = (run.stderr or run.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {run.returncode}"
