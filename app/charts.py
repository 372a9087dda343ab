"""Plotly figures of the UI, built from plain data (no Streamlit here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from app.whatif import CacheView, ExpertView, RoleSeries, StepView, downsample
from simulator.cost.step import CATEGORIES
from simulator.des import SimResult

HEIGHT = 340
PALETTE = qualitative.Plotly + qualitative.D3
"""Colours of instances (one per instance, the same in every row of a figure)."""


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(title=title, height=height, margin={"l": 50, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": -0.2})
    return fig


def latency_histograms(result: SimResult, metrics: Mapping[str, Any]) -> go.Figure:
    """Distributions of TTFT and TPOT over completed requests, with p50 and p90 marked."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (ms)", "TPOT (ms)"))
    for col, (values, key) in enumerate(((result.ttft_s * 1e3, "ttft_ms"),
                                         (result.tpot_s * 1e3, "tpot_ms")), start=1):
        v = values[~np.isnan(values)]
        fig.add_trace(go.Histogram(x=v, nbinsx=40, name=key.split("_")[0].upper(),
                                   showlegend=False), row=1, col=col)
        for stat, dash in (("p50", "dash"), ("p90", "dot")):
            x = metrics[key][stat]
            if x is not None:
                fig.add_vline(x=x, line_dash=dash, line_color="firebrick", row=1, col=col,
                              annotation_text=stat, annotation_position="top")
    fig.update_yaxes(title_text="requests", row=1, col=1)
    return _layout(fig, "Latency distributions")


def throughput_figure(times: np.ndarray, values: np.ndarray, average: float | None) -> go.Figure:
    """Output tokens per second per GPU over simulated time, with the run's average."""
    fig = go.Figure(go.Scatter(x=times, y=values, mode="lines", name="output tok/s/GPU",
                               line_shape="hv"))
    if average is not None:
        fig.add_hline(y=average, line_dash="dash", line_color="gray",
                      annotation_text=f"average {average:,.0f}")
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(title_text="output tok/s per GPU")
    return _layout(fig, "Throughput over time")


TIMELINE_ROWS = ("queued requests", "requests in step (all ranks)", "KV-cache use (%)")


def role_timelines_figure(series: Mapping[str, RoleSeries]) -> go.Figure:
    """Per role, its instances together: requests queued and in the step (summed over the
    role's instances) and KV-cache use (their mean)."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("queued requests (sum over the role's instances)",
                                        "requests in step (sum over the role's instances)",
                                        "KV-cache use (% , mean over the role's instances)"))
    for i, s in enumerate(series.values()):
        name = f"{s.role} ({s.instances} instance{'s' if s.instances != 1 else ''})"
        for row, y in enumerate((s.queue, s.batch, s.kv_use * 100), start=1):
            fig.add_trace(go.Scatter(x=s.time, y=y, mode="lines", name=name, legendgroup=name,
                                     showlegend=row == 1, line_shape="hv",
                                     line={"color": PALETTE[i % len(PALETTE)]}),
                          row=row, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=3, col=1)
    return _layout(fig, "Per role", height=560)


def timelines_figure(result: SimResult, names: Sequence[str] | None = None,
                     max_points: int = 1500) -> go.Figure:
    """Small multiples, one column per instance of `names` (default: every instance, at most
    8): queued requests, requests in the step, and KV-cache use, per step."""
    names = list(names if names is not None else sorted(result.timelines))[:8] or []
    cols = max(len(names), 1)
    fig = make_subplots(rows=3, cols=cols, shared_xaxes=True, shared_yaxes="rows",
                        vertical_spacing=0.07, horizontal_spacing=0.02,
                        column_titles=names or None,
                        row_titles=["queued", "in step", "KV %"])
    for col, name in enumerate(names, start=1):
        t = downsample(result.timelines[name], max_points)
        color = PALETTE[(col - 1) % len(PALETTE)]
        mode = "lines+markers" if len(t.time) <= 50 else "lines"
        for row, y in enumerate((t.queue, t.batch, t.kv_use * 100), start=1):
            fig.add_trace(go.Scatter(x=t.time, y=y, mode=mode, name=name, legendgroup=name,
                                     showlegend=False, line_shape="hv",
                                     line={"color": color}, marker={"size": 4}),
                          row=row, col=col)
    fig.update_xaxes(title_text="simulated time (s)", row=3)
    return _layout(fig, "Per instance", height=520)


def cache_figure(view: CacheView) -> go.Figure:
    """Left: where the input tokens came from (HBM prefix cache, host tier, computed); right:
    TTFT p50 and p90 per bucket of turn depth."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6],
                        subplot_titles=(f"input tokens by source ({view.hit_share:.0%} cached)",
                                        "TTFT by turn depth (ms)"))
    total = sum(view.tiers.values()) or 1
    colors = ("seagreen", "goldenrod", "slategray")
    for (label, tokens), color in zip(view.tiers.items(), colors, strict=False):
        fig.add_trace(go.Bar(x=[label], y=[100 * tokens / total], name=label,
                             marker_color=color, showlegend=False,
                             text=[f"{tokens:,}"], textposition="outside",
                             hovertemplate="%{x}: %{text} tokens (%{y:.1f} %)<extra></extra>"),
                      row=1, col=1)
    depths = list(view.ttft_by_depth)
    for stat, color in (("p50", "steelblue"), ("p90", "darkorange")):
        fig.add_trace(go.Bar(x=depths, y=[view.ttft_by_depth[d].get(stat) for d in depths],
                             name=f"TTFT {stat}", marker_color=color), row=1, col=2)
    fig.update_yaxes(title_text="% of input tokens", row=1, col=1)
    fig.update_xaxes(tickangle=0, row=1, col=1)
    fig.update_xaxes(title_text="turn depth (turns before it in its agent)", row=1, col=2)
    return _layout(fig, "Prefix cache and turns", height=380)


def breakdown_figure(steps: Mapping[str, StepView], shares: Mapping[str, float]) -> go.Figure:
    """Left: one step per role by category, as shares of its total (cost model; the total is
    in the role's label); right: the run's GPU time shares (simulation)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.65, 0.35],
                        subplot_titles=("one step per role (% of its time)",
                                        "share of GPU time in run (%)"))
    labels = [f"{r} ({v.step.total_ms:,.1f} ms)" for r, v in steps.items()]
    for cat in CATEGORIES:
        share = [100 * v.step.breakdown.get(cat, 0.0) / v.step.total_ms if v.step.total_ms
                 else 0.0 for v in steps.values()]
        fig.add_trace(go.Bar(y=labels, x=share, name=cat, orientation="h", legendgroup=cat),
                      row=1, col=1)
    fig.add_trace(go.Bar(x=list(shares), y=[100 * v for v in shares.values()],
                         name="share %", showlegend=False, marker_color="slategray"),
                  row=1, col=2)
    fig.update_layout(barmode="stack")
    return _layout(fig, "Step-time breakdown")


def expert_figure(view: ExpertView, layer: int) -> go.Figure:
    """Tokens per EP rank in one MoE layer, relative to the mean, before and after EPLB."""
    ranks = np.arange(view.ranks)
    fig = go.Figure()
    for label, share in (("before EPLB (linear placement)", view.before),
                         ("after EPLB" if view.redundant else "no EPLB (0 redundant)",
                          view.after)):
        fig.add_trace(go.Bar(x=ranks, y=share[layer] * view.ranks, name=label))
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray")
    fig.update_xaxes(title_text="EP rank")
    fig.update_yaxes(title_text="tokens / mean")
    return _layout(fig, f"{view.role}: expert load per rank, MoE layer {layer}")


def pareto_figure(points: Sequence[Mapping[str, Any]], chosen: int | None,
                  chosen_label: str = "chosen") -> go.Figure:
    """Simulated plans as throughput per GPU against median tokens/s per user: every simulated
    plan, the feasible ones, the Pareto front, and the plan the objective picked (its marker
    says by which rule)."""
    fig = go.Figure()
    groups = (("simulated, misses SLOs", lambda p: not p["feasible"], "lightgray"),
              ("meets SLOs", lambda p: p["feasible"] and not p["front"], "steelblue"),
              ("Pareto front", lambda p: p["front"], "darkorange"))
    for name, keep, color in groups:
        sel = [p for p in points if keep(p)]
        if name == "Pareto front":
            sel = sorted(sel, key=lambda p: p["user"])
        fig.add_trace(go.Scatter(
            x=[p["user"] for p in sel], y=[p["throughput"] for p in sel], name=name,
            mode="lines+markers" if name == "Pareto front" else "markers",
            marker={"color": color, "size": 9}, text=[p["label"] for p in sel],
            hovertemplate="trial %{customdata}<br>%{text}<br>%{x:.1f} tok/s/user, "
                          "%{y:,.0f} tok/s/GPU<extra></extra>",
            customdata=[p["trial"] for p in sel]))
    best = [p for p in points if p["trial"] == chosen]
    if best:
        fig.add_trace(go.Scatter(x=[best[0]["user"]], y=[best[0]["throughput"]],
                                 name=f"{chosen_label} (trial {chosen})", mode="markers",
                                 marker={"symbol": "star", "size": 18, "color": "crimson"}))
    fig.update_xaxes(title_text="tokens/s per user (p50)")
    fig.update_yaxes(title_text="throughput per GPU (tok/s)")
    return _layout(fig, "Throughput per GPU vs tokens/s per user", height=420)


def curves_figure(sweep: Mapping[str, Any], user_floor: float | None = None,
                  unit: str = "", chosen: int | None = None,
                  chosen_label: str | None = None) -> go.Figure:
    """The load sweep: per swept deployment, throughput per GPU against tokens/s per user, one
    point per load (hollow where an SLO is missed), the envelope over every deployment and load,
    the tokens/s-per-user SLO as a vertical line, and the chosen plan's point (trial `chosen`)
    at its load."""
    axis = str(sweep.get("user_axis", "tok_s_user_p50"))
    fig = go.Figure()
    for curve in sweep.get("curves", []):
        pts = [p for p in curve["points"] if p.get(axis) is not None]
        fig.add_trace(go.Scatter(
            x=[p[axis] for p in pts], y=[p["throughput_tok_s_gpu"] for p in pts],
            mode="lines+markers+text", name=curve["label"],
            text=[f"{p['load']:g}" for p in pts], textposition="top center",
            marker={"size": 9, "symbol": ["circle" if p["meets_slo"] else "circle-open"
                                          for p in pts]},
            hovertemplate=f"%{{text}} {unit}<br>%{{x:.1f}} tok/s/user, "
                          "%{y:,.0f} tok/s/GPU<extra></extra>"))
    env = sorted((p for p in sweep.get("envelope", []) if p.get(axis) is not None),
                 key=lambda p: p[axis])
    if env:
        fig.add_trace(go.Scatter(x=[p[axis] for p in env],
                                 y=[p["throughput_tok_s_gpu"] for p in env],
                                 mode="lines", line={"shape": "vh", "width": 3, "color": "black"},
                                 name="envelope (any deployment and load)"))
    best = [p for c in sweep.get("curves", []) for p in c["points"]
            if chosen is not None and p.get("trial") == chosen and p.get(axis) is not None]
    if best:
        fig.add_trace(go.Scatter(x=[best[0][axis]], y=[best[0]["throughput_tok_s_gpu"]],
                                 name=f"{chosen_label or 'chosen'} (trial {chosen})",
                                 mode="markers",
                                 marker={"symbol": "star", "size": 18, "color": "crimson"}))
    if user_floor is not None:
        fig.add_vline(x=user_floor, line_dash="dash", line_color="gray",
                      annotation_text=f"SLO {user_floor:g} tok/s/user")
    label = "90 % of requests reach" if axis == "tok_s_user_p90" else "median"
    fig.update_xaxes(title_text=f"tokens/s per user ({label})")
    fig.update_yaxes(title_text="throughput per GPU (tok/s)")
    return _layout(fig, "Across load: throughput per GPU vs tokens/s per user", height=420)
