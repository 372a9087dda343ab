"""The throughput–interactivity chart of a load sweep, written to a PNG, SVG or PDF file.

Each deployment the search swept over load is one curve: tokens/s per GPU (what the rack earns)
on the y axis against tokens/s per user (how fast each reply streams) on the x axis. Raising the
load moves a deployment up and to the left: more tokens per GPU, slower for each user. A marker
is filled where that load met every SLO and hollow where it did not; the small number beside it
is the load. The Pareto envelope over all deployments, the most throughput per GPU reachable at
a given speed per user or faster, is the thick staircase on top (drawn where its points carry
the x axis's statistic: the search's envelope is over the median). An SLO on tokens/s per user is
the dashed vertical line: only points to its right serve users fast enough.

Drawn with matplotlib's Agg canvas on a `Figure` of its own (no pyplot, no global backend), and
imported only when a chart is written, so the CLI starts without it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simulator.specs.errors import SpecError

FORMATS = (".png", ".svg", ".pdf")
"""File suffixes `write_chart` writes; the suffix picks the format."""
USER_AXES = {
    "tok_s_user_p50": "tokens/s per user (median)",
    "tok_s_user_p90": "tokens/s per user, 90 % of requests reach",
}
"""Point key plotted on the x axis -> its axis label."""
MAX_LABELS = 8
"""Most points of one curve annotated with their load (evenly spread, ends included)."""
METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
}
"""Per format, the metadata left out so the same input writes the same bytes."""


def _labelled(n: int) -> set[int]:
    """Indices of the points of an n-point curve that get a load label."""
    if n <= MAX_LABELS:
        return set(range(n))
    return {round(i * (n - 1) / (MAX_LABELS - 1)) for i in range(MAX_LABELS)}


def check_chart_path(path: str | Path) -> Path:
    """The path, or SpecError when a chart cannot be written there (checked before the work
    that makes the chart's data)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise SpecError(f"cannot write a chart to {str(path)!r}: the file name must end in "
                        f"{', '.join(FORMATS)}")
    if not path.parent.is_dir():
        raise SpecError(f"cannot write a chart to {str(path)!r}: the directory "
                        f"{str(path.parent)!r} does not exist")
    return path


def _check(path: Path, curves: Sequence[Mapping[str, Any]], user_axis: str) -> str:
    """The output format of path; SpecError for anything that would fail before drawing."""
    check_chart_path(path)
    if user_axis not in USER_AXES:
        raise SpecError(f"user_axis {user_axis!r} is not one of {', '.join(USER_AXES)}")
    if not curves:
        raise SpecError("nothing to plot: the search simulated no load sweep")
    return path.suffix.lower().lstrip(".")


def write_chart(path: str | Path, curves: Sequence[Mapping[str, Any]],
                envelope: Sequence[Mapping[str, Any]], *, title: str = "",
                user_axis: str = "tok_s_user_p50", user_floor: float | None = None,
                load_unit: str = "") -> Path:
    """Draw the load sweep's curves and Pareto envelope into path (.png, .svg or .pdf)."""
    path = Path(path)
    fmt = _check(path, curves, user_axis)
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError as exc:
        raise SpecError("drawing a chart needs matplotlib: pip install 'rackplan[ui]' "
                        "(or pip install matplotlib)") from exc

    with matplotlib.rc_context({"svg.hashsalt": "rackplan", "svg.fonttype": "path"}):
        fig = Figure(figsize=(9, 6), dpi=120, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        missed = False
        for curve in curves:
            pts = [p for p in curve["points"] if p.get(user_axis) is not None]
            xs = [p[user_axis] for p in pts]
            ys = [p["throughput_tok_s_gpu"] for p in pts]
            (line,) = ax.plot(xs, ys, "-o", ms=5, lw=1.2, label=curve["label"])
            misses = [i for i, p in enumerate(pts) if not p["meets_slo"]]
            missed = missed or bool(misses)
            ax.plot([xs[i] for i in misses], [ys[i] for i in misses], "o", ms=5,
                    color=line.get_color(), mfc="white", zorder=line.get_zorder() + 0.1)
            for i in sorted(_labelled(len(pts))):
                ax.annotate(f"{pts[i]['load']:g}", (xs[i], ys[i]), xytext=(4, 4),
                            textcoords="offset points", fontsize=7, color=line.get_color())
        env = sorted((e for e in envelope if e.get(user_axis) is not None),
                     key=lambda e: e[user_axis])
        if env:  # the envelope is over the x axis's statistic only (p50 from the search)
            ax.step([e[user_axis] for e in env], [e["throughput_tok_s_gpu"] for e in env],
                    where="pre", color="black", lw=2.6, alpha=0.8, zorder=3,
                    label="Pareto envelope")
        if user_floor is not None:
            ax.axvline(user_floor, ls="--", color="dimgrey", lw=1.2,
                       label=f"SLO: {user_floor:g} tokens/s per user")
        handles, _ = ax.get_legend_handles_labels()
        if missed:
            handles.append(Line2D([], [], ls="", marker="o", ms=5, color="dimgrey", mfc="white",
                                  label="hollow: misses an SLO at that load"))
        ax.legend(handles=handles, fontsize=8, loc="best")
        ax.set_xlabel(USER_AXES[user_axis])
        ax.set_ylabel("tokens/s per GPU")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title(title)
        note = f"numbers at points: load ({load_unit})" if load_unit else "numbers at points: load"
        ax.text(1.0, -0.09, note, transform=ax.transAxes, ha="right", va="top", fontsize=7,
                color="dimgrey")

        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as out:
                fig.savefig(out, format=fmt, metadata=METADATA[fmt])
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return path
