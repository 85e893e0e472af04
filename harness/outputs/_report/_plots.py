"""Plotly figures of the report and the comparison, rendered as HTML fragments.

Every fragment is a ``<div>`` plus the script that draws it; plotly.js itself is inlined once
per page (:func:`plotly_js`), so a page needs no network (plotly's ``to_html`` with
``include_plotlyjs=False``; https://plotly.com/python/interactive-html-export/).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from harness.outputs._report._data import (
    RunData,
    bin_width_s,
    cdf,
    engine_steps,
    events,
    hop_samples,
    itl_ms,
    load_sockets,
    ok_metrics,
    preemptions_per_s,
    rwnd_column,
    slowest_connections,
    tokens_per_s,
    ttft_ms,
    user_classes,
)
from harness.outputs._report._swimlane import CLIENT_KINDS, ENGINE_KINDS, MARKS, Span, Swimlane

EVENT_STYLE = {  # kind -> (row label, marker symbol, colour)
    "phase": ("phase", "diamond", "#444444"),
    "stall": ("stall onset", "triangle-down", "#e69f00"),
    "abort": ("client abort", "x", "#d55e00"),
    "cut": ("RST / cut", "square", "#cc0000"),
}
CONFIG = {"displaylogo": False, "responsive": True}


def plotly_js() -> str:
    """The plotly.js bundle shipped with the ``plotly`` package (about 4.7 MB)."""
    return get_plotlyjs()


def fragment(fig: go.Figure, div_id: str) -> str:
    """``fig`` as a ``<div id=div_id class="plotly-graph-div">`` and its drawing script."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG)


def timeline(data: RunData) -> go.Figure:
    """Rows on one shared time axis (s since the first measurement): events, KV cache usage
    and running/waiting requests (from the engine's steps when it wrote them, the scrapes'
    KV usage dotted beside them), preemptions/s, output tokens/s per user class and, when sockets
    were sampled, Send-Q of the slowest connections and their rwnd-limited time."""
    m = ok_metrics(data)
    socks = load_sockets(data)
    slowest = slowest_connections(socks)
    rwnd = rwnd_column(socks) if slowest else None
    rows = ["events", "KV cache usage (%)", "requests", "preemptions / s", "output tokens / s"]
    if slowest:
        rows.append("Send-Q (bytes), slowest connections")
    if rwnd:
        rows.append(f"{rwnd}, slowest connections")
    heights = [0.6] + [1.0] * (len(rows) - 1)
    fig = make_subplots(
        rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.035,
        subplot_titles=rows, row_heights=heights,
    )  # fmt: skip
    _events_row(fig, data)
    steps = engine_steps(data)
    if "kv_cache_usage" in steps:  # the engine's own figure at every step
        fig.add_trace(_step_line(steps["s"], steps["kv_cache_usage"] * 100.0,
                                 "KV cache usage % (engine steps)"), 2, 1)  # fmt: skip
    if "kv_cache_usage" in m:
        scraped = _line(m["s"], m["kv_cache_usage"] * 100.0, "KV cache usage % (scrapes)")
        if "kv_cache_usage" in steps:
            scraped.update(line={"dash": "dot", "width": 1}, mode="lines+markers")
        fig.add_trace(scraped, 2, 1)
    fig.update_yaxes(range=[0, 105], row=2, col=1)
    counts = steps if "num_requests_running" in steps else m
    for col, name in (("num_requests_running", "running"), ("num_requests_waiting", "waiting")):
        if col in counts:
            line = _step_line if counts is steps else _line
            fig.add_trace(line(counts["s"], counts[col], name), 3, 1)
    rate = preemptions_per_s(m)
    if rate is not None:
        fig.add_trace(_line(m["s"], rate, "preemptions/s"), 4, 1)
    width = bin_width_s(data)
    for name, series in tokens_per_s(data).items():
        trace = _line(series.index + width / 2, series.to_numpy(), f"{name} tokens/s")
        fig.add_trace(trace, 5, 1)
    if slowest:
        total = socks.groupby("s")["send_q_bytes"].sum()
        fig.add_trace(
            go.Scatter(x=total.index, y=total.to_numpy(), name="Send-Q all load connections",
                       mode="lines", line={"width": 1, "dash": "dot", "color": "#555"}),
            6, 1,
        )  # fmt: skip
    for conn in slowest:
        c = socks[socks["conn"] == conn]
        fig.add_trace(_line(c["s"], c["send_q_bytes"], f"Send-Q {conn}"), 6, 1)
        if rwnd:
            fig.add_trace(_line(c["s"], c[rwnd], f"{rwnd} {conn}"), 7, 1)
    return _timeline_layout(
        fig, len(rows), 170, [ev.s for ev in events(data) if ev.kind == "phase"]
    )


def _timeline_layout(
    fig: go.Figure, n_rows: int, row_px: int, phases: Sequence[float]
) -> go.Figure:
    """``fig``, rows stacked on one time axis, finished as a timeline: dotted lines at
    ``phases`` (s), a legend beside each row, the axis title, spikes across the rows, and
    ``row_px`` pixels a row."""
    _rules(fig, xs=phases)
    _legend_per_row(fig, n_rows)
    fig.update_xaxes(title_text="seconds since the first measurement", row=n_rows, col=1)
    fig.update_xaxes(showspikes=True, spikemode="across", spikethickness=1)
    fig.update_layout(
        height=row_px * n_rows + 60, margin={"l": 60, "r": 190, "t": 40, "b": 50},
        hovermode="x", template="plotly_white",
    )  # fmt: skip
    return fig


HOP_ROWS = (  # proxy.parquet column, row title
    ("client_send_q_bytes", "Send-Q toward the clients or the hop in front (bytes, largest conn.)"),
    ("upstream_recv_q_bytes", "Recv-Q from upstream (bytes, largest connection)"),
    ("buffered_bytes", "buffered in user space (bytes)"),
    ("rss_bytes", "RSS of the process tree (bytes)"),
)
HOP_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")


def hops_timeline(data: RunData, phases: Sequence[float] = ()) -> go.Figure | None:
    """What is observable of each proxy hop over time (s since the first measurement), one
    trace per hop labelled ``hop <i> <kind>`` (``proxy.parquet``): its largest Send-Q toward the
    hop in front of it or the clients, its largest Recv-Q from its upstream, its buffered bytes
    (a row only when some hop's are observable) and its RSS, with dotted lines at ``phases``
    (s). ``None`` without proxy samples."""
    hops = hop_samples(data)
    if not hops:
        return None
    rows = [(col, title) for col, title in HOP_ROWS
            if any(col in f and f[col].notna().any() for f in hops.values())]  # fmt: skip
    if not rows:
        return None
    fig = make_subplots(
        rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.06,
        subplot_titles=[title for _, title in rows],
    )  # fmt: skip
    for r, (col, _) in enumerate(rows, start=1):
        for i, (label, frame) in enumerate(hops.items()):
            if col in frame and frame[col].notna().any():
                colour = HOP_COLOURS[i % len(HOP_COLOURS)]  # one hop, one colour in every row
                trace = _line(frame["s"], frame[col], label).update(line_color=colour)
                fig.add_trace(trace, r, 1)
    return _timeline_layout(fig, len(rows), 150, phases)


def _legend_per_row(fig: go.Figure, n_rows: int) -> None:
    """Give each row its own legend beside it (plotly's ``legend2``, ``legend3`` ...)."""
    for trace in fig.data:
        row = int(trace.yaxis[1:] or 1)
        trace.legend = "legend" if row == 1 else f"legend{row}"
    for row in range(1, n_rows + 1):
        top = fig.layout[f"yaxis{row if row > 1 else ''}"].domain[1]
        name = "legend" if row == 1 else f"legend{row}"
        fig.layout[name] = {"y": top, "yanchor": "top", "x": 1.01, "xanchor": "left",
                            "font": {"size": 11}, "tracegroupgap": 2}  # fmt: skip


def _rules(fig: go.Figure, *, xs: Sequence[float] = (), ys: Sequence[float] = ()) -> None:
    """Dotted vertical lines at ``xs`` (s) across every row and thin horizontal ones at ``ys``,
    set in one assignment: plotly's ``add_vline``/``add_hline`` copy every shape already there
    and check every subplot on each call (half a second of a report's rendering)."""
    vertical = {"dash": "dot", "color": "#888", "width": 1}
    shapes = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": x,
            "x1": x,
            "y0": 0,
            "y1": 1,
            "line": vertical,
        }
        for x in xs
    ]
    shapes += [
        {"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": y, "y1": y,
         "line": {"color": "#eee", "width": 1}, "layer": "below"}
        for y in ys
    ]  # fmt: skip
    fig.update_layout(shapes=shapes)


def _line(x: object, y: object, name: str) -> go.Scatter:
    return go.Scatter(x=x, y=y, name=name, mode="lines", line={"width": 1.5})


def _step_line(x: object, y: object, name: str) -> go.Scatter:
    """A value that holds until the next sample (an engine step)."""
    return go.Scatter(x=x, y=y, name=name, mode="lines", line={"width": 1.5, "shape": "hv"})


def _events_row(fig: go.Figure, data: RunData) -> None:
    evs = events(data)
    labels = [label for label, _, _ in EVENT_STYLE.values()]
    for kind, (label, symbol, colour) in EVENT_STYLE.items():
        mine = [e for e in evs if e.kind == kind]
        if not mine:
            continue
        fig.add_trace(
            go.Scatter(
                x=[e.s for e in mine], y=[label] * len(mine), mode="markers", name=label,
                text=[e.text for e in mine], hovertemplate="%{x:.2f} s: %{text}<extra></extra>",
                marker={"symbol": symbol, "color": colour, "size": 9},
            ),
            1, 1,
        )  # fmt: skip
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=labels, row=1, col=1)


def cdf_figure(series: dict[str, np.ndarray], *, title: str, unit: str) -> go.Figure:
    """Overlaid empirical CDFs, one trace per name, on a log x axis (values ≤ 0 dropped)."""
    fig = go.Figure()
    for name, values in series.items():
        x, p = cdf(values[values > 0])
        if x.size:
            x, p = np.concatenate(([x[0]], x)), np.concatenate(([0.0], p))  # rise from 0
            fig.add_trace(
                go.Scatter(
                    x=x, y=p, name=f"{name} (n={values.size})", mode="lines",
                    line={"shape": "hv", "width": 2},
                    hovertemplate=f"%{{x:.2f}} {unit}: %{{y:.3f}}<extra>{name}</extra>",
                )
            )  # fmt: skip
    fig.update_layout(
        title=title, height=360, template="plotly_white",
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        xaxis={"type": "log", "title": unit, "dtick": "D2"},
        yaxis={"title": "fraction ≤ x", "range": [0, 1.02]},
    )  # fmt: skip
    return fig


def class_cdfs(data: RunData) -> tuple[go.Figure, go.Figure]:
    """TTFT and per-token ITL CDFs, one trace per user class."""
    classes = user_classes(data)
    ttft = cdf_figure({c: ttft_ms(data, c) for c in classes}, title="TTFT", unit="ms")
    itl = cdf_figure({c: itl_ms(data, c) for c in classes}, title="ITL per token", unit="ms")
    return ttft, itl


_ROW_OFFSET = 0.21  # engine row above the lane's centre, client row below (lane units)


def swimlane_figure(lanes: Swimlane, phases: list[float]) -> go.Figure:
    """One lane per request of ``lanes`` (slowest at the top), x in seconds since the first
    measurement: coloured spans as horizontal bars (engine row above, client row below; only
    the client row when ``lanes`` has no engine data), marks for KV freed and cuts, and dotted
    lines at ``phases`` (s). Hovering a span or mark shows the lane's numbers."""
    offset = _ROW_OFFSET if lanes.has_engine else 0.0
    y_of = {"engine": -offset, "client": offset}
    title = {"engine": "engine (upper row)", "client": "client (lower row)"}
    if not lanes.has_engine:
        title["client"] = "client"
    fig = go.Figure()
    for row, kinds in (("engine", ENGINE_KINDS), ("client", CLIENT_KINDS)):
        for kind, (label, colour) in kinds.items():
            spans = [s for s in lanes.spans if s.row == row and s.kind == kind]
            if spans:
                bar = _bars(spans, lanes, label, colour, y_of[row], 0.38 if offset else 0.6)
                fig.add_trace(bar.update(legendgroup=row, legendgrouptitle_text=title[row]))
    for kind, (label, row, symbol, colour) in MARKS.items():
        marks = [m for m in lanes.marks if m.kind == kind]
        if marks:
            fig.add_trace(
                go.Scatter(
                    x=[m.s for m in marks], y=[m.lane + y_of[row] for m in marks],
                    mode="markers", name=label, legendgroup=row,
                    legendgrouptitle_text=title[row],
                    customdata=[lanes.numbers[m.lane] for m in marks],
                    hovertemplate=f"{label} at %{{x:.3f}} s<br>%{{customdata}}<extra></extra>",
                    marker={"symbol": symbol, "color": colour, "size": 11, "line": {"width": 2}},
                )
            )  # fmt: skip
    n = len(lanes.labels)
    _rules(fig, xs=phases, ys=[lane - 0.5 for lane in range(1, n)])  # a thin rule between lanes
    fig.update_yaxes(
        tickvals=list(range(n)), ticktext=lanes.labels, autorange="reversed",
        showgrid=False, zeroline=False, tickfont={"size": 11},
    )  # fmt: skip
    fig.update_xaxes(title_text="seconds since the first measurement", showspikes=True,
                     spikemode="across", spikethickness=1)  # fmt: skip
    fig.update_layout(
        barmode="overlay", height=max(380, 26 * n + 110), template="plotly_white",
        hovermode="closest", margin={"l": 130, "r": 190, "t": 20, "b": 50},
        legend={"x": 1.01, "xanchor": "left", "y": 1, "font": {"size": 11},
                "groupclick": "toggleitem", "tracegroupgap": 8},
    )  # fmt: skip
    return fig


def _bars(
    spans: list[Span], lanes: Swimlane, label: str, colour: str, dy: float, width: float
) -> go.Bar:
    """``spans`` as horizontal bars (``base`` the start, ``x`` the length, s) at ``lane + dy``."""
    return go.Bar(
        orientation="h", name=label, width=width,
        base=[s.start_s for s in spans], x=[s.end_s - s.start_s for s in spans],
        y=[s.lane + dy for s in spans],
        customdata=[[s.start_s, s.end_s, (s.end_s - s.start_s) * 1000.0, lanes.numbers[s.lane]]
                    for s in spans],
        hovertemplate=f"{label}: %{{customdata[0]:.3f}} to %{{customdata[1]:.3f}} s "
        "(%{customdata[2]:,.1f} ms)<br>%{customdata[3]}<extra></extra>",
        marker={"color": colour, "line": {"width": 0}},
    )  # fmt: skip
