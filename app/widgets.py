"""Streamlit pieces the pages share: errors as one sentence, a per-session folder, the model /
hardware / workload inputs, metric cards, and long work under a status box with progress."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TypeVar, cast

import streamlit as st
from pydantic import ValidationError

from app.deploying import Unavailable
from app.inputs import (
    CustomTraffic,
    agentx_workload,
    custom_workload,
    preset_workload,
    save_trace,
    trace_workload,
)
from app.whatif import Card
from executor.backends.base import LaunchError
from planner.defaults import workload_presets
from simulator.specs.errors import SpecError
from simulator.specs.hardware import HARDWARE
from simulator.specs.model import preset_names
from simulator.specs.workload import Workload

T = TypeVar("T")
PEOPLE_ERRORS = (SpecError, ValidationError, Unavailable, LaunchError, OSError)
"""Errors that are about the input or the machine, shown as their message."""
ERROR_ICON = ":material/error:"
"""Streamlit's bundled Material Symbols font draws it (no emoji font needed)."""
CUSTOM, TRACE = "custom traffic", "upload a trace"
MOONCAKE, AGENTX = "Mooncake or CSV rows", "AgentX session traces"
"""Trace formats an upload may have."""
Arrival = Literal["closed", "poisson", "bursty"]


def message(error: BaseException) -> str:
    """One sentence for an error shown to people."""
    if isinstance(error, ValidationError):
        first = error.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"])
        return f"{where}: {first['msg']}" if where else str(first["msg"])
    text = " ".join(str(error).split())
    return text or type(error).__name__


@contextmanager
def errors_shown() -> Iterator[None]:
    """Run the block; bad input ends it with st.error holding one sentence, not a
    traceback."""
    try:
        yield
    except PEOPLE_ERRORS as e:
        st.error(message(e), icon=ERROR_ICON)


def session_dir() -> Path:
    """A temporary folder of this browser session (uploaded traces, dry-run files)."""
    if "session_dir" not in st.session_state:
        st.session_state["session_dir"] = tempfile.mkdtemp(prefix="rackplan-ui-")
    return Path(st.session_state["session_dir"])


def model_and_hardware(prefix: str, model: str = "deepseek-v3",
                       hardware: str = "h200") -> tuple[str, str]:
    """Select boxes for the model and hardware presets (defaults: `model`, `hardware`)."""
    models, kinds = preset_names(), list(HARDWARE)
    a, b = st.columns(2)
    with a:
        chosen = st.selectbox("Model", models, index=models.index(model),
                              key=f"{prefix}_model", help="Model preset (simulator/specs)")
    with b:
        hw = st.selectbox("Hardware", kinds, index=kinds.index(hardware),
                          key=f"{prefix}_hardware", help="Hardware preset")
    return str(chosen), str(hw)


def workload_input(prefix: str, default_requests: int = 1000,
                   default_source: str = CUSTOM) -> Callable[[], Workload]:
    """The workload inputs; returns a function that builds the Workload (raising SpecError for
    bad values) when the page runs. `default_source`: custom traffic or a preset name."""
    sources = [CUSTOM, *workload_presets(), TRACE]
    source = st.radio("Traffic", sources, index=sources.index(default_source), horizontal=True,
                      key=f"{prefix}_wl_source",
                      help="Synthetic traffic, a shipped preset, or a recorded trace")
    if source == TRACE:
        kind = st.radio("Trace format", [MOONCAKE, AGENTX], horizontal=True,
                        key=f"{prefix}_wl_trace_format",
                        help="Mooncake: one request a row (timestamp, lengths, hash_ids); "
                             "AgentX: session trees with 64-token block hashes and subagents, "
                             "replayed as the AgentX harness does")
        agentx = kind == AGENTX
        upload = st.file_uploader(
            "AgentX traces (.jsonl, one session a line, or .json)" if agentx else
            "Trace (Mooncake JSONL, or CSV with timestamp, input_length, output_length)",
            type=["jsonl", "json"] if agentx else ["jsonl", "csv"], key=f"{prefix}_wl_trace")
        c1, c2 = st.columns(2)
        requests = c1.number_input("Requests" if agentx else
                                   "Requests (first rows of the trace)", 1, 10_000_000,
                                   default_requests, key=f"{prefix}_wl_trace_requests")
        if agentx:
            lanes = c2.number_input("Sessions alive at once", 1, 1_000_000, 8,
                                    key=f"{prefix}_wl_trace_sessions")
        else:
            scale = c2.number_input("Time scale (0.5 replays twice as fast)", 0.01, 100.0,
                                    1.0, key=f"{prefix}_wl_trace_scale")

        def from_trace() -> Workload:
            if upload is None:
                raise SpecError("no trace uploaded; upload a .jsonl or .csv trace, or pick "
                                "another traffic source")
            path = save_trace(upload.name, upload.getvalue(), session_dir() / "traces",
                              agentx=agentx)
            if agentx:
                return agentx_workload(path, int(lanes), int(requests))
            return trace_workload(path, int(requests), float(scale))

        return from_trace
    if source != CUSTOM:
        c1, c2 = st.columns(2)
        preset = preset_workload(str(source))
        requests = c1.number_input("Requests", 1, 10_000_000, preset.requests,
                                   key=f"{prefix}_wl_preset_requests")
        seed = c2.number_input("Seed", 0, 2**31 - 1, preset.seed, key=f"{prefix}_wl_seed_p")
        return lambda: preset_workload(str(source), int(requests), int(seed))
    c1, c2, c3 = st.columns(3)
    arrival = c1.selectbox("Arrival", ["closed", "poisson", "bursty"], key=f"{prefix}_wl_arrival",
                           help="closed: fixed concurrency; poisson/bursty: a request rate")
    if arrival == "closed":
        concurrency = c2.number_input("Concurrency", 1, 1_000_000, 256,
                                      key=f"{prefix}_wl_concurrency")
        rate = 20.0
    else:
        rate = c2.number_input("Rate (requests/s)", 0.001, 1e6, 20.0, key=f"{prefix}_wl_rate")
        concurrency = 256
    requests = c3.number_input("Requests", 1, 10_000_000, default_requests,
                               key=f"{prefix}_wl_requests")
    c4, c5, c6 = st.columns(3)
    inp = c4.number_input("Input tokens", 1, 1_000_000, 2000, key=f"{prefix}_wl_input")
    out = c5.number_input("Output tokens", 1, 1_000_000, 500, key=f"{prefix}_wl_output")
    spread = c6.number_input("Length spread (log-normal sigma; 0: fixed)", 0.0, 3.0, 0.0,
                             key=f"{prefix}_wl_spread")
    c7, c8 = st.columns(2)
    hit = c7.number_input("Prefix-cache hit rate", 0.0, 0.99, 0.0, key=f"{prefix}_wl_hit")
    seed = c8.number_input("Seed", 0, 2**31 - 1, 0, key=f"{prefix}_wl_seed")
    traffic = CustomTraffic(arrival=cast(Arrival, arrival), concurrency=int(concurrency),
                            rate=float(rate),
                            requests=int(requests), input_tokens=int(inp),
                            output_tokens=int(out), spread=float(spread),
                            prefix_hit_rate=float(hit), seed=int(seed))
    return lambda: custom_workload(traffic)


def metric_cards(cards: Sequence[Card], per_row: int = 5) -> None:
    """Cards in rows of `per_row`."""
    for start in range(0, len(cards), per_row):
        cols = st.columns(per_row)
        for col, card in zip(cols, cards[start:start + per_row], strict=False):
            col.metric(card.label, card.value, help=card.help)


def _cancel(key: str) -> None:
    """Cancel button callback: runs before the page is drawn again, which has already
    interrupted the work (a rerun stops the script at its next Streamlit call)."""
    st.session_state[key] = True


def cancelled(key: str) -> bool:
    """Whether the run under `key` was cancelled (read once)."""
    return bool(st.session_state.pop(f"{key}_cancelled", False))


def with_status(label: str, work: Callable[[Callable[[float, str], None]], T],
                done: Callable[[T], str], key: str | None = None) -> T | None:
    """Run `work` under a status box with a progress bar it advances (share, text); errors
    for people end as st.error, and the status box says so. With `key`, a Cancel button
    under the bar stops the work at its next progress report (`cancelled(key)` then says
    so)."""
    with st.status(label, expanded=True) as status:
        bar = st.progress(0.0, text="starting")
        slot = st.empty()
        if key is not None:
            slot.button("Cancel", key=f"{key}_cancel", icon=":material/cancel:",
                        on_click=_cancel, args=(f"{key}_cancelled",),
                        help="Stop this run; the results shown before it stay")

        def advance(share: float, text: str) -> None:
            bar.progress(min(max(share, 0.0), 1.0), text=text)

        try:
            result = work(advance)
        except PEOPLE_ERRORS as e:
            slot.empty()
            status.update(label=f"{label} failed", state="error", expanded=True)
            st.error(message(e), icon=ERROR_ICON)
            return None
        slot.empty()
        status.update(label=done(result), state="complete", expanded=False)
        return result
