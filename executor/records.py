"""Typed launch records: one per host process of a rendered deployment.

A record says what the process is (instance, role, host index inside the instance), what it
serves, its parallelism as data (the tensor-parallel size, and its host's slice of the data-parallel
ranks: their number, the ranks here, the first of them, the head's address and RPC port, whether
the host is headless), its HTTP port, its environment, and the engine's other flags as ordered
(name, value) pairs whose values stay typed (a whole number, a JSON object) until the last step.

`to_argv()` is that last step: the launcher, the model, the flags, then `--tensor-parallel-size`,
the data-parallel flags and `--port` (vLLM's `serve` names, the engine rackplan deploys). Rules
check records (executor/rules.py) and backends read their fields; nothing parses a command line
back. A backend that needs the command as shell words with some values left to the shell (a
cluster's head address, a pod's start rank) asks `shell_words`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

FlagValue = str | int | Mapping[str, object] | None
"""A flag's value: a word, a whole number, a JSON object (a config), or None for a switch."""
Flag = tuple[str, FlagValue]
"""One flag: its name (--max-num-seqs) and its value."""

TP_FLAG = "--tensor-parallel-size"
PORT_FLAG = "--port"
HEADLESS_FLAG = "--headless"
DP_FLAGS = {"size": "--data-parallel-size", "local": "--data-parallel-size-local",
            "address": "--data-parallel-address", "rpc_port": "--data-parallel-rpc-port",
            "start_rank": "--data-parallel-start-rank"}
"""DataParallel field -> the vLLM flag that carries it."""


def flag_word(value: str | int | Mapping[str, object]) -> str:
    """A flag value as one word: a JSON object compact with sorted keys, anything else as is."""
    if isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def flag_words(flags: Iterable[Flag]) -> list[str]:
    """Flags as argv words: the name, then its value unless it is a switch."""
    words: list[str] = []
    for name, value in flags:
        words.append(name)
        if value is not None:
            words.append(flag_word(value))
    return words


@dataclass(frozen=True)
class DataParallel:
    """One host's slice of an instance's data-parallel ranks."""

    size: int
    """Data-parallel ranks of the whole instance (--data-parallel-size)."""
    local: int
    """Ranks this host runs (--data-parallel-size-local)."""
    start_rank: int = 0
    """The first of this host's ranks (--data-parallel-start-rank)."""
    address: str | None = None
    """The head host, which owns the data-parallel RPC port (--data-parallel-address)."""
    rpc_port: int | None = None
    """The head's data-parallel RPC port (--data-parallel-rpc-port)."""
    headless: bool = False
    """A host that runs engine ranks only, no API server (--headless): every host but the head."""

    @property
    def gives_start_rank(self) -> bool:
        """Whether the command names its start rank (a headless host, or one not starting at 0);
        vLLM reads a start rank as hybrid load balancing."""
        return self.headless or self.start_rank > 0

    def options(self) -> tuple[Flag, ...]:
        """The data-parallel flags, in the order they are rendered."""
        flags: list[Flag] = [(DP_FLAGS["size"], self.size), (DP_FLAGS["local"], self.local)]
        if self.address is not None:
            flags.append((DP_FLAGS["address"], self.address))
        if self.rpc_port is not None:
            flags.append((DP_FLAGS["rpc_port"], self.rpc_port))
        if self.gives_start_rank:
            flags.append((DP_FLAGS["start_rank"], self.start_rank))
        if self.headless:
            flags.append((HEADLESS_FLAG, None))
        return tuple(flags)


@dataclass(frozen=True)
class LaunchRecord:
    """One engine process on one host, as data."""

    instance: str
    """e.g. decode-0."""
    role: str
    """prefill, decode or aggregated."""
    host: int
    """Host index inside the instance (0 is the head)."""
    model: str
    """What the engine serves (a model folder or id)."""
    flags: tuple[Flag, ...] = ()
    """The engine's other flags, in order (batching, memory, cache, experts, connector,
    compilation); values typed."""
    tp: int = 1
    """Tensor-parallel ranks of the engine, or of each data-parallel rank."""
    dp: DataParallel | None = None
    """This host's data-parallel slice; None without data parallelism."""
    port: int | None = None
    """HTTP port of the head; None for headless hosts."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the process adds."""
    launcher: tuple[str, ...] = ("vllm", "serve")
    """The engine's command before the model."""

    @property
    def gpus(self) -> int:
        """GPUs this process uses on its host."""
        return (self.dp.local if self.dp is not None else 1) * self.tp

    def value(self, name: str) -> FlagValue:
        """The value of one of `flags` (None when absent or a switch)."""
        return next((v for n, v in self.flags if n == name), None)

    def has(self, name: str) -> bool:
        """Whether `flags` gives this flag."""
        return any(n == name for n, _ in self.flags)

    def options(self) -> tuple[Flag, ...]:
        """Every flag in argv order: `flags`, then tensor and data parallelism, then the port."""
        tp: tuple[Flag, ...] = ((TP_FLAG, self.tp),) if self.tp > 1 else ()
        dp = self.dp.options() if self.dp is not None else ()
        port: tuple[Flag, ...] = ((PORT_FLAG, self.port),) if self.port is not None else ()
        return (*self.flags, *tp, *dp, *port)

    def args(self) -> tuple[str, ...]:
        """The words after the launcher: the model, then every flag."""
        return (self.model, *flag_words(self.options()))

    def to_argv(self) -> tuple[str, ...]:
        """The process's command line as argv: the last step, nothing reads it back."""
        return (*self.launcher, *self.args())

    @property
    def argv(self) -> tuple[str, ...]:
        """`to_argv()`, for callers that show or run the words."""
        return self.to_argv()

    def command_line(self) -> str:
        """The process as one shell line (environment first, arguments quoted)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.to_argv())

    def shell_words(self, executable: str | None = None,
                    dp: Mapping[str, str] | None = None) -> list[str]:
        """The command as shell words, each quoted, except `executable` (given as is, in place
        of the launcher's first word) and the DataParallel fields named in `dp` (address,
        start_rank, local, ...), whose values are the shell expressions given, double-quoted."""
        unknown = set(dp or {}) - set(DP_FLAGS)
        if unknown:
            raise ValueError(f"no data-parallel field {sorted(unknown)[0]!r}; fields: "
                             f"{', '.join(DP_FLAGS)}")
        exprs = {DP_FLAGS[key]: f'"{expr}"' for key, expr in (dp or {}).items()}
        words = [executable if executable is not None else shlex.quote(self.launcher[0]),
                 *(shlex.quote(w) for w in (*self.launcher[1:], self.model))]
        for name, value in self.options():
            words.append(shlex.quote(name))
            if value is not None:
                words.append(exprs.get(name) or shlex.quote(flag_word(value)))
        return words


@dataclass(frozen=True)
class Rendered:
    """Every process of a deployment and the router in front of them."""

    processes: tuple[LaunchRecord, ...]
    router: dict[str, object]
    """Proxy configuration: its port, the prefill and decode (or aggregated) URLs, and each
    role's router policy (`prefill_policy`, ...: the plan's, see simulator/specs/routing.py)."""

    @property
    def router_policies(self) -> dict[str, str]:
        """The router's `<role>_policy` entries, for backends that write the proxy's config."""
        return {k: str(v) for k, v in self.router.items() if k.endswith("_policy")}
