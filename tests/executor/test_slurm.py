"""executor/backends/slurm: the batch scripts are valid bash, and run for real under fake
scontrol/srun/vllm they start every rendered process once, each data-parallel rank once, with
NIXL's and UCX's environment, and the first instance's head node runs the router; sbatch and
scancel are driven for real (fake tools record the calls)."""

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from executor.backends import slurm
from executor.backends.base import LaunchError
from executor.backends.slurm import UCX_TLS, SlurmBackend, uses_nixl
from executor.proxy import RouterConfig
from tests.executor.cluster import calls, fake_tool, pd_rendering, uneven_rendering, use_path

SRUN = """\
nodes=1
while [[ "$1" == --* ]]; do
  case "$1" in --nodes=*) nodes="${1#--nodes=}" ;; esac
  shift
done
for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i "$@" || exit $?; done
"""
"""srun: the command once per node, one after the other, with SLURM_NODEID set."""
SCONTROL = 'tr "," "\\n" <<< "$3"\n'
"""scontrol show hostnames A,B,C: one name a line."""
VLLM = """\
out="$FAKE_OUT/task${SLURM_ARRAY_TASK_ID}-node${SLURM_NODEID}"
printf '%s\\n' "$VLLM_NIXL_SIDE_CHANNEL_HOST" "${UCX_TLS-}" "${UCX_NET_DEVICES-}" vllm "$@" \\
  > "$out"
"""
"""vllm: writes the NIXL host, UCX's transports and devices, then its argv, one word a line."""


@pytest.fixture
def tools(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    for name, body in (("srun", SRUN), ("scontrol", SCONTROL), ("vllm", VLLM)):
        fake_tool(bin_dir, name, body)
    return bin_dir


def test_every_script_is_valid_bash_with_the_right_directives(tmp_path):
    backend = SlurmBackend(pd_rendering(), tmp_path / "deploy-dsv3")
    files = backend.render()
    assert [f.name for f in files] == ["prefill.sbatch", "prefill-node.sh", "decode.sbatch",
                                       "decode-node.sh", "router.sh"]
    for f in files:
        subprocess.run(["bash", "-n", str(f)], check=True)
        assert f.stat().st_mode & 0o111
    directives = {f.name: [ln.removeprefix("#SBATCH ") for ln in f.read_text().splitlines()
                           if ln.startswith("#SBATCH")] for f in files}
    assert directives["decode.sbatch"] == [
        "--job-name=dsv3-decode", "--array=0-0", "--nodes=5", "--ntasks-per-node=1",
        "--gpus-per-node=8", "--exclusive", "--output=logs/%x-%a.out"]
    assert "--array=0-3" in directives["prefill.sbatch"]
    assert "--nodes=1" in directives["prefill.sbatch"]
    assert directives["router.sh"] == []  # not a job: prefill-0's head node runs it
    assert "bash router.sh" in (files[0].parent / "prefill.sbatch").read_text()
    assert "router.sh" not in (files[0].parent / "decode.sbatch").read_text()
    assert (tmp_path / "deploy-dsv3" / "slurm" / "logs").is_dir()


def run_task(folder: Path, bin_dir: Path, script: str, task: int, nodes: list[str],
             check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": ",".join(nodes),
           "SLURM_ARRAY_TASK_ID": str(task), "SLURM_SUBMIT_DIR": str(folder),
           "FAKE_OUT": str(folder), "FAKE_LOG": str(folder / "calls.log"), **env}
    return subprocess.run(["bash", script], cwd=folder, env=env, check=check,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("rendering", [pd_rendering, uneven_rendering])
def test_each_array_task_starts_its_instance_s_processes_with_every_rank_once(
        tmp_path, tools, rendering):
    rendered = rendering()
    backend = SlurmBackend(rendered, tmp_path / "run")
    backend.render()
    folder = backend.folder
    me = socket.gethostname()
    for layout in backend.layouts:
        for task in range(layout.instances):
            nodes = [f"{layout.role}{task}n{k}" for k in range(layout.hosts)]
            run_task(folder, tools, f"{layout.role}.sbatch", task, nodes,
                     RACKPLAN_UCX_NET_DEVICES="mlx5_0:1,mlx5_1:1")
            url = (folder / "endpoints" / f"{layout.role}-{task}.url").read_text()
            assert url == f"http://{nodes[0]}:{layout.port}\n"
            ranks: list[int] = []
            for proc in layout.processes:
                nixl_host, tls, devices, *argv = (folder / f"task{task}-node{proc.host}"
                                                  ).read_text().splitlines()
                expected = proc if proc.dp is None else replace(
                    proc, dp=replace(proc.dp, address=nodes[0]))
                assert argv == list(expected.to_argv())
                nixl = uses_nixl(proc)
                assert nixl == (proc.role != "aggregated")
                assert nixl_host == (me if nixl else "")
                assert (tls, devices) == ((UCX_TLS, "mlx5_0:1,mlx5_1:1") if nixl else ("", ""))
                start, local = (proc.dp.start_rank, proc.dp.local) if proc.dp else (0, 1)
                ranks += range(start, start + local)
            assert sorted(ranks) == list(range(layout.dp_size))
            assert not (folder / f"task{task}-node{layout.hosts}").exists()


def test_a_node_outside_the_instance_fails_loudly(tmp_path, tools):
    backend = SlurmBackend(pd_rendering(), tmp_path / "run")
    backend.render()
    r = subprocess.run(["bash", "decode-node.sh", "head0"], cwd=backend.folder,
                       env={"PATH": f"{tools}:/usr/bin:/bin", "SLURM_NODEID": "5"},
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "SLURM_NODEID=5 is not a node of this 5-node instance" in r.stderr


def test_ucx_transports_follow_rackplan_ucx_tls_and_devices_default_to_all(tmp_path, tools):
    backend = SlurmBackend(pd_rendering(), tmp_path / "run")
    backend.render()
    folder = backend.folder
    run_task(folder, tools, "decode.sbatch", 0, [f"d{k}" for k in range(5)],
             RACKPLAN_UCX_TLS="rc,cuda_copy")
    _, tls, devices, *_ = (folder / "task0-node3").read_text().splitlines()
    assert (tls, devices) == ("rc,cuda_copy", "all")


def test_nixl_is_read_from_the_connector_alone_or_inside_a_multi_connector():
    head = pd_rendering().processes[0]
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    multi = {"kv_connector": "MultiConnector", "kv_role": "kv_producer",
             "kv_connector_extra_config": {"connectors": [
                 nixl, {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}]}}
    other = {"kv_connector": "ExampleConnector", "kv_role": "kv_producer"}

    def with_connector(config):
        return replace(head, flags=tuple((n, config if n == "--kv-transfer-config" else v)
                                         for n, v in head.flags))
    assert uses_nixl(with_connector(nixl)) and uses_nixl(with_connector(multi))
    assert not uses_nixl(with_connector(other))
    assert not uses_nixl(replace(head, flags=()))


def test_router_script_writes_router_json_from_the_instances_urls_and_runs_the_proxy(tmp_path):
    backend = SlurmBackend(pd_rendering(), tmp_path / "run")
    backend.render()
    folder = backend.folder
    (folder / "endpoints").mkdir()
    for name, url in [(f"prefill-{i}", f"http://p{i}:8100") for i in range(4)] + [
            ("decode-0", "http://d0:8104")]:
        (folder / "endpoints" / f"{name}.url").write_text(url + "\n")
    fake_tool(tmp_path / "bin", "python", 'echo "$*" > proxy.args\n')
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(folder),
           "FAKE_LOG": str(tmp_path / "calls.log")}
    subprocess.run(["bash", "router.sh"], cwd=folder, env=env, check=True)
    config = json.loads((folder / "router.json").read_text())
    assert config == {"port": 8099, "host": "0.0.0.0",
                      "prefill_urls": [f"http://p{i}:8100" for i in range(4)],
                      "decode_urls": ["http://d0:8104"],
                      "prefill_policy": "prefix_aware", "decode_policy": "least_requests"}
    RouterConfig.from_dict(config)
    assert (folder / "proxy.args").read_text() == "-m executor.proxy --config router.json\n"
    assert backend.url == f"http://{socket.gethostname()}:8099"


def _urls_of_every_instance_but(folder: Path, skip: str) -> None:
    (folder / "endpoints").mkdir(exist_ok=True)
    for name, url in [(f"prefill-{i}", f"http://p{i}:8100") for i in range(4)] + [
            ("decode-0", "http://d0:8104")]:
        if name != skip:
            (folder / "endpoints" / f"{name}.url").write_text(url + "\n")


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_first_instance_s_head_node_runs_the_router_until_its_engine_ends(tmp_path, tools):
    backend = SlurmBackend(pd_rendering(), tmp_path / "run")
    backend.render()
    folder = backend.folder
    _urls_of_every_instance_but(folder, "prefill-0")
    fake_tool(tools, "srun", "until [[ -s proxy.pid ]]; do sleep 0.1; done\n")  # the engine
    fake_tool(tools, "python", 'echo "$*" > proxy.args; echo $$ > proxy.pid; exec sleep 60\n')
    run_task(folder, tools, "prefill.sbatch", 0, ["p0n0"])  # the router ends with the engine
    assert (folder / "proxy.args").read_text() == "-m executor.proxy --config router.json\n"
    assert json.loads((folder / "router.json").read_text())["prefill_urls"][0] == \
        "http://p0n0:8100"
    assert backend.url == f"http://{socket.gethostname()}:8099"
    assert _gone(int((folder / "proxy.pid").read_text()))
    for path in (folder / "proxy.args", folder / "proxy.pid", folder / "router.url"):
        path.unlink()
    fake_tool(tools, "srun", "exit 0\n")
    run_task(folder, tools, "prefill.sbatch", 1, ["p1n0"])
    run_task(folder, tools, "decode.sbatch", 0, [f"d0n{k}" for k in range(5)])
    assert not (folder / "proxy.args").exists()  # only prefill-0 runs it


def test_a_router_that_gives_up_ends_its_task_with_an_error(tmp_path, tools):
    backend = SlurmBackend(pd_rendering(), tmp_path / "run")
    backend.render()
    folder = backend.folder
    _urls_of_every_instance_but(folder, "decode-0")
    fake_tool(tools, "srun", "echo $$ > engine.pid; exec sleep 300\n")  # it keeps serving
    r = run_task(folder, tools, "prefill.sbatch", 0, ["p0n0"], check=False,
                 RACKPLAN_ENDPOINT_WAIT_S="0")
    assert r.returncode == 1
    assert _gone(int((folder / "engine.pid").read_text()))  # the task ended its engine
    assert "no URL from decode-0 after 0 s" in (folder / "logs" / "router.out").read_text()


def test_launch_submits_every_role_and_teardown_cancels_them(
        tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    fake_tool(bin_dir, "sbatch", """\
        case "$*" in
          *prefill.sbatch) echo 101 ;;
          *decode.sbatch) echo "102;cluster-a" ;;
        esac
        """)
    fake_tool(bin_dir, "scancel", "exit 0\n")
    use_path(monkeypatch, bin_dir)
    backend = SlurmBackend(pd_rendering(), tmp_path / "run")
    stale = backend.folder / "endpoints" / "decode-0.url"
    stale.parent.mkdir(parents=True)
    stale.write_text("http://old:1\n")
    backend.launch()
    assert calls(log) == ["sbatch --parsable prefill.sbatch", "sbatch --parsable decode.sbatch"]
    assert not stale.exists()  # a previous run's URLs are not taken for this one's
    assert json.loads((backend.folder / "jobs.json").read_text()) == {
        "prefill": "101", "decode": "102"}
    backend.teardown()
    backend.teardown()
    assert calls(log)[2:] == ["scancel 101 102"]


class _Completions(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        self.server.bodies.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"choices": [{"text": "!"}]}')

    def log_message(self, *args) -> None:
        pass


def test_wait_ready_sends_a_completion_through_the_router_and_names_a_job_that_ended(
        tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "POLL_S", 0.05)
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("QUEUED", "101_0 101_1 102_0")
    fake_tool(bin_dir, "squeue", 'printf "%s\\n" $QUEUED\n')
    use_path(monkeypatch, bin_dir)
    server = HTTPServer(("127.0.0.1", 0), _Completions)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        backend = SlurmBackend(pd_rendering(), tmp_path / "run")
        backend.render()
        backend.jobs = [("prefill", "101"), ("decode", "102")]
        (backend.folder / "router.url").write_text(f"http://127.0.0.1:{server.server_port}\n")
        backend.wait_ready(10)
        assert server.bodies == [("/v1/completions", {  # type: ignore[attr-defined]
            "model": "/models/DeepSeek-V3", "prompt": "Hello", "max_tokens": 1})]
        monkeypatch.setenv("QUEUED", "101_0")
        with pytest.raises(LaunchError, match=r"slurm job 102 \(decode\) ended before the "
                                              "deployment was ready"):
            backend.wait_ready(10)
    finally:
        server.shutdown()
        server.server_close()


def test_wait_ready_gives_up_at_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "POLL_S", 0.05)
    use_path(monkeypatch, tmp_path / "empty", system=False)
    backend = SlurmBackend(pd_rendering(), tmp_path / "run")
    with pytest.raises(LaunchError, match="not ready within 0 s"):
        backend.wait_ready(0.2)
