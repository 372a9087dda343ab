"""What the cluster backends (kubernetes, slurm) need to know of a rendered deployment.

A cluster schedules each role as N alike instances of H hosts, so one template per role is
enough: instance 0's processes are the template, and what differs from one instance to the next
in the rendering (host names, ports chosen to keep instances on one machine apart) is set by the
scheduler instead — the head's address from the scheduler, the same ports on every instance.
Everything here reads the launch records' typed fields. Also here: a command as shell lines and
names as DNS labels, which both cluster backends write.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.records import LaunchRecord, Rendered
from simulator.specs.errors import SpecError

HOST_ENV = ("VLLM_NIXL_SIDE_CHANNEL_HOST",)
"""Environment variables that hold the process's own host address (set by the cluster)."""


@dataclass(frozen=True)
class RoleLayout:
    """One role's instances, as a cluster launches them."""

    role: str
    instances: int
    """Alike instances of this role."""
    processes: tuple[LaunchRecord, ...]
    """Instance 0's processes, head first: the template of every instance."""

    @property
    def head(self) -> LaunchRecord:
        return self.processes[0]

    @property
    def hosts(self) -> int:
        """Hosts (pods, nodes) per instance; the first is the head."""
        return len(self.processes)

    @property
    def port(self) -> int:
        """HTTP port of each instance's head."""
        assert self.head.port is not None  # role_layouts checked it
        return self.head.port

    @property
    def gpus_per_host(self) -> int:
        """GPUs each host of an instance uses (the head's share)."""
        return self.head.gpus

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks per instance (1 without data parallelism)."""
        return self.head.dp.size if self.head.dp is not None else 1

    @property
    def ranks_per_host(self) -> int:
        """Data-parallel ranks each full host runs (the head's)."""
        return self.local_ranks(0)

    @property
    def model(self) -> str:
        """What the engine serves (the served model name of every instance)."""
        return self.head.model

    def local_ranks(self, host: int) -> int:
        """Data-parallel ranks that host `host` of an instance runs."""
        dp = self.processes[host].dp
        return dp.local if dp is not None else 1


def role_layouts(rendered: Rendered) -> list[RoleLayout]:
    """The roles of a rendering, in its order, each from its instance 0."""
    layouts = []
    for role in dict.fromkeys(p.role for p in rendered.processes):
        procs = [p for p in rendered.processes if p.role == role]
        first = procs[0].instance
        template = tuple(sorted((p for p in procs if p.instance == first), key=lambda p: p.host))
        if template[0].port is None:
            raise SpecError(f"{first} has no head process with an HTTP port")
        if len(template) > 1 and template[0].dp is None:
            raise SpecError(f"{first} spans {len(template)} hosts without data parallelism; "
                            "a cluster backend launches multi-host instances as DEP groups only")
        layouts.append(RoleLayout(role=role, instances=len({p.instance for p in procs}),
                                  processes=template))
    return layouts


def shell_lines(words: list[str], indent: str = "  ") -> str:
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
