"""What the cluster backends (kubernetes, slurm) need to know of a rendered deployment.

A cluster schedules each role as N alike instances of H hosts, so one template per role is
enough: instance 0's processes are the template, and what differs from one instance to the next
in the rendering (host names, ports chosen to keep instances on one machine apart) is set by the
scheduler instead — the head's address from the scheduler, the same ports on every instance.
Also here: writing a file atomically, which every backend does.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.render import Process, Rendered
from executor.rules import parse_flags
from simulator.specs.errors import SpecError

HOST_ENV = ("VLLM_NIXL_SIDE_CHANNEL_HOST",)
"""Environment variables that hold the process's own host address (set by the cluster)."""
DP_ADDRESS = "--data-parallel-address"
START_RANK = "--data-parallel-start-rank"
LOCAL_SIZE = "--data-parallel-size-local"


@dataclass(frozen=True)
class RoleLayout:
    """One role's instances, as a cluster launches them."""

    role: str
    instances: int
    """Alike instances of this role."""
    hosts: int
    """Hosts (pods, nodes) per instance; the first is the head."""
    gpus_per_host: int
    """GPUs each host of an instance uses (the head's share)."""
    port: int
    """HTTP port of each instance's head."""
    processes: tuple[Process, ...]
    """Instance 0's processes, head first: the template of every instance."""
    dp_size: int
    """Data-parallel ranks per instance (1 without data parallelism)."""

    @property
    def head(self) -> Process:
        return self.processes[0]

    @property
    def model(self) -> str:
        """What vllm serves (the served model name of every instance)."""
        return self.head.argv[2]

    def local_ranks(self, host: int) -> int:
        """Data-parallel ranks that host `host` of an instance runs."""
        value = parse_flags(self.processes[host].argv).get(LOCAL_SIZE)
        return int(value) if isinstance(value, str) else self.gpus_per_host


def role_layouts(rendered: Rendered) -> list[RoleLayout]:
    """The roles of a rendering, in its order, each from its instance 0."""
    layouts = []
    for role in dict.fromkeys(p.role for p in rendered.processes):
        procs = [p for p in rendered.processes if p.role == role]
        first = procs[0].instance
        template = tuple(sorted((p for p in procs if p.instance == first), key=lambda p: p.host))
        head = template[0]
        if head.port is None:
            raise SpecError(f"{first} has no head process with an HTTP port")
        flags = parse_flags(head.argv)
        dp = int(str(flags.get("--data-parallel-size", 1)))
        if len(template) > 1 and dp <= 1:
            raise SpecError(f"{first} spans {len(template)} hosts without data parallelism; "
                            "a cluster backend launches multi-host instances as DEP groups only")
        if dp > 1:
            gpus = int(str(flags.get(LOCAL_SIZE, dp)))
        else:
            gpus = int(str(flags.get("--tensor-parallel-size", 1)))
        layouts.append(RoleLayout(role=role, instances=len({p.instance for p in procs}),
                                  hosts=len(template), gpus_per_host=gpus, port=head.port,
                                  processes=template, dp_size=dp))
    return layouts


def shell_words(words: list[str], indent: str = "  ") -> str:
    """Shell words joined with one flag per line (a backslash ending each line but the last)."""
    text = words[0]
    for word in words[1:]:
        text += (f" \\\n{indent}" if word.startswith("--") else " ") + word
    return text


def dns_label(text: str, limit: int = 40) -> str:
    """`text` as a lowercase DNS label of at most `limit` characters (Kubernetes and Slurm
    names): other characters become dashes."""
    out = "".join(c if c.isascii() and c.isalnum() else "-" for c in text.lower())
    out = "-".join(part for part in out.split("-") if part)[:limit].strip("-")
    if not out or not out[0].isalpha():
        out = ("rp-" + out)[:limit].strip("-")
    return out
