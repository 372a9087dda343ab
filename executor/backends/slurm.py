"""Slurm: one sbatch job array per role, and a router job.

Each role becomes `<role>.sbatch`: a job array with one task per instance, each task holding
`--nodes` = hosts of one instance with one task and all GPUs per node. The task names its first
node the head (`scontrol show hostnames`), records the instance's URL under endpoints/, and
starts `<role>-node.sh` on every node with `srun`; that script picks the node's own command by
`SLURM_NODEID` — node 0 the head's `vllm serve`, node k the headless one with its slice of
data-parallel ranks — with the head's address and the node's own host name filled in.
`router.sbatch` waits for every instance's URL, writes router.json and runs our P/D proxy,
then records its own URL in router.url. The run directory must be on a file system that the
login node and the compute nodes share, and `vllm` (or $VLLM) and rackplan's `python` (or
$PYTHON) must be on the nodes' PATH.

`render` writes the scripts under <run_dir>/slurm/; `launch` submits them with sbatch (the
router after the roles have started), `wait_ready` waits for router.url and one completion
through it, `teardown` cancels the submitted jobs.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import ClassVar

from executor.backends.base import Backend, LaunchError, write_atomic
from executor.backends.layout import HOST_ENV, RoleLayout, dns_label, role_layouts, shell_lines
from executor.records import LaunchRecord, Rendered

SCRIPT_DIR = "slurm"
"""Folder under the run directory that holds the scripts; jobs run in it."""
ENDPOINT_WAIT_S = 3600
"""How long the router job waits for the instances' URLs."""
POLL_S = 5.0


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
        """The router's URL once its job has written it, else None."""
        path = self.folder / "router.url"
        return path.read_text(encoding="utf-8").strip() if path.is_file() else None

    # --- scripts -------------------------------------------------------------------------

    def role_script(self, layout: RoleLayout) -> str:
        """The sbatch script of one role: a job array, one task per instance."""
        gpus = f"#SBATCH --gpus-per-node={layout.gpus_per_host}\n" if layout.gpus_per_host else ""
        node = f"{layout.role}-node.sh"
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
            f"exec srun --nodes={layout.hosts} --ntasks={layout.hosts} --ntasks-per-node=1 "
            f'--kill-on-bad-exit=1 bash {node} "$HEAD"\n')

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
        """The router job: wait for every instance's URL, write router.json (with the plan's
        router policies), run the proxy."""
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
            f"# rackplan {self.app}: the P/D router; starts once the instances have.\n"
            f"#SBATCH --job-name={self.app}-router\n"
            "#SBATCH --nodes=1\n"
            "#SBATCH --ntasks=1\n"
            "#SBATCH --output=logs/%x.out\n"
            "set -euo pipefail\n"
            'cd "${SLURM_SUBMIT_DIR:-.}"\n'
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
        """<role>.sbatch and <role>-node.sh per role, and router.sbatch, under
        <run_dir>/slurm/ (with its logs/ folder, which Slurm does not create)."""
        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        files = []
        for layout in self.layouts:
            files.append(write_atomic(self.folder / f"{layout.role}.sbatch",
                                      self.role_script(layout), 0o755))
            files.append(write_atomic(self.folder / f"{layout.role}-node.sh",
                                      self.node_script(layout), 0o755))
        files.append(write_atomic(self.folder / "router.sbatch", self.router_script(), 0o755))
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
        """Submit every role's job array, then the router once they have started."""
        if shutil.which("sbatch") is None:
            raise LaunchError("sbatch not found on PATH; use --dry-run to write the batch "
                              f"scripts to {self.folder}")
        self.render()
        for stale in [*self.folder.glob("endpoints/*.url"), self.folder / "router.url"]:
            stale.unlink(missing_ok=True)
        for layout in self.layouts:
            self.jobs.append((layout.role, self._sbatch(f"{layout.role}.sbatch")))
        after = ":".join(job for _, job in self.jobs)
        self.jobs.append(("router", self._sbatch(f"--dependency=after:{after}",
                                                  "router.sbatch")))
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


def _env_lines(proc: LaunchRecord) -> list[str]:
    """NAME=value assignments of a process's environment; its own host name from $SELF."""
    return [f'{key}="$SELF"' if key in HOST_ENV else f"{key}={shlex.quote(value)}"
            for key, value in sorted(proc.env.items())]


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
