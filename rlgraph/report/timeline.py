"""Timelines of a plan, predicted and measured: Chrome trace JSON, an HTML page, a PNG.

Everything here reads event dicts `{node, step, start, end, group, occupies}` (seconds from
the start), the format both the compiler's simulator (`plan.schedule.events`) and the
runtime's `trace.json` use, so one renderer draws both and puts them side by side.

- event dicts <-> Chrome trace live in `rlgraph.report.chrome_trace`; `write_timeline` uses them.
- `write_timeline`: timeline.json, timeline.html (self-contained inline SVG, no network)
  and timeline.png (matplotlib, imported only here, Agg backend).

The drawings show one lane per group (plus `cpu` for nodes in no group), bars coloured by
node kind and labelled with their step, and only the first `DRAWN_STEPS` steps: a
steady-state pipeline repeats itself, and the JSON keeps every event.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlgraph.compiler.plan import Plan
from rlgraph.report.chrome_trace import (
    KIND_COLORS,
    NO_GROUP,
    OTHER_COLOR,
    chrome_trace,
    kind_of,
    occupied_groups,
    role_of,
)

DRAWN_STEPS = 10
MIN_BAR = 0.002  # shortest bar drawn, as a fraction of the time axis
PNG_WIDTH_IN, PNG_DPI = 13.0, 110


# ---------------------------------------------------------------- layout shared by HTML and PNG


@dataclass
class Bar:
    """One event drawn on one lane."""

    event: dict
    kind: str
    lane: int
    row: int


@dataclass
class Panel:
    """A timeline to draw: lanes (one per group), bars, the time span and a caption."""

    title: str
    lanes: list[str]
    lane_labels: list[str]
    rows: list[int]  # sub-rows per lane (overlapping bars on one lane stack up)
    bars: list[Bar]
    end: float
    caption: str

    def flows(self) -> list[tuple[Bar, Bar]]:
        """(generate(t), train(t)) bar pairs, each on its first lane."""
        firsts: dict[tuple[str, int], Bar] = {}
        for bar in self.bars:
            firsts.setdefault((bar.event["node"], bar.event["step"]), bar)
        gens = [b for b in firsts.values() if role_of(b.kind).samples]
        trains = [b for b in firsts.values() if role_of(b.kind).advances_policy]
        return [(g, t) for g in gens for t in trains if g.event["step"] == t.event["step"]
                and g.event["end"] <= self.end and t.event["start"] < self.end]


def _panel(title: str, events: Sequence[dict], plan: Plan,
           kinds: Mapping[str, str], drawn_steps: int) -> Panel:
    """Place events on lanes: one per group in placement order, overlapping bars stacked."""
    gpus = {g.name: g.gpus for g in plan.placement.groups}
    lanes: list[str] = plan.placement.names
    steps = sorted({e["step"] for e in events})
    shown = set(steps[:drawn_steps])
    # the time window of the first steps, with everything that ran in it (later steps too)
    end = max((e["end"] for e in events if e["step"] in shown), default=0.0) or 1.0
    drawn = [e for e in events if e["start"] < end]
    for event in drawn:
        for group in occupied_groups(event):
            lane = NO_GROUP if group is None else str(group)
            if lane not in lanes:
                lanes.append(lane)
    if NO_GROUP in lanes:
        lanes.remove(NO_GROUP)
        lanes.append(NO_GROUP)
    ends: dict[int, list[float]] = {i: [] for i in range(len(lanes))}
    bars: list[Bar] = []
    for event in sorted(drawn, key=lambda e: (e["start"], e["end"])):
        for group in occupied_groups(event):
            lane = lanes.index(NO_GROUP if group is None else str(group))
            rows = ends[lane]
            row = next((r for r, end in enumerate(rows) if end <= event["start"] + 1e-12),
                       len(rows))
            if row == len(rows):
                rows.append(0.0)
            rows[row] = event["end"]
            bars.append(Bar(event, kind_of(event, kinds), lane, row))
    unit = "slot" if plan.placement.local else "GPU"
    labels = [f"{lane} ({gpus[lane]} {unit}{'s' if gpus[lane] != 1 else ''})"
              if gpus.get(lane) else lane for lane in lanes]
    more = f" of {len(steps)}" if len(steps) > len(shown) else ""
    caption = f"steps 0–{len(shown) - 1}{more}" if shown else "no events"
    return Panel(title, lanes, labels, [max(1, len(ends[i])) for i in range(len(lanes))],
                 bars, end, caption)


def steady_period(events: Iterable[dict], kinds: Mapping[str, str] | None = None) -> float | None:
    """Seconds per step in the second half of a timeline (from train's end times), or None."""
    ends: dict[int, float] = {}
    for event in events:
        if role_of(kind_of(event, kinds)).advances_policy and isinstance(event.get("step"), int):
            ends[event["step"]] = max(ends.get(event["step"], 0.0), event["end"])
    steps = sorted(ends)
    if len(steps) < 3:
        return None
    first, last = steps[len(steps) // 2 - 1], steps[-1]
    return (ends[last] - ends[first]) / (last - first)


def fmt_seconds(seconds: float | None) -> str:
    """Seconds for people: 350 µs, 12.5 ms, 2.41 s, 612 s."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


def _ticks(end: float, count: int = 8) -> list[float]:
    """Round tick positions (1, 2, 5 x 10^k) from 0 to end."""
    raw = end / count
    base = 10 ** math.floor(math.log10(raw))
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    return [i * step for i in range(int(end / step) + 1)]


def _headline(plan: Plan) -> list[str]:
    """The plan's figures as short phrases."""
    sched = plan.schedule
    return [
        f"period {fmt_seconds(sched.period_s)}/step",
        f"bound {fmt_seconds(sched.bound_s)}",
        f"colocated sync {fmt_seconds(sched.sync_period_s)}",
        f"speedup {sched.speedup_vs_sync:.2f}×",
        f"max policy lag {plan.lag.max_policy_lag}",
    ]


def _panels(plan: Plan, measured: list[dict] | None, drawn_steps: int) -> list[Panel]:
    kinds = plan.kinds
    events = plan.schedule.events
    predicted = _panel("predicted (compiler)", events, plan, kinds, drawn_steps)
    if measured is None:
        return [predicted]
    measured_panel = _panel("measured (run)", measured, plan, kinds, drawn_steps)
    period = steady_period(measured, kinds)
    measured_panel.caption += f" · measured period {fmt_seconds(period)}/step"
    return [predicted, measured_panel]


# ---------------------------------------------------------------- HTML

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 20px 0 4px; }
.facts { font-size: 15px; } .facts b { color: #000; } .muted { color: #666; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -1px; border-radius: 2px; }
svg { width: 100%; height: auto; background: #fff; }
svg text { font: 11px system-ui, sans-serif; }
svg .lane { font-size: 12px; font-weight: 600; } svg .bar:hover { stroke: #000; }
svg .flow { fill: none; stroke: #555; stroke-width: 1; opacity: .55; }
"""

_WIDTH, _LEFT, _RIGHT, _ROW, _GAP, _TOP, _AXIS = 1150, 170, 20, 22, 10, 8, 28


def _svg(panel: Panel, index: int) -> str:
    """One panel as an inline SVG: lanes, bars with hover titles, flow arrows, time axis."""
    span = _WIDTH - _LEFT - _RIGHT
    scale = span / panel.end

    def x(t: float) -> float:
        return _LEFT + t * scale

    lane_top, y = [], _TOP
    for rows in panel.rows:
        lane_top.append(y)
        y += rows * _ROW + _GAP
    height = y + _AXIS
    out = [f'<svg viewBox="0 0 {_WIDTH} {height:.0f}" role="img" font-size="11" '
           f'font-family="sans-serif" aria-label="{html.escape(panel.title)}">',
           f'<defs><marker id="arrow{index}" viewBox="0 0 8 8" refX="8" refY="4" '
           'markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z" '
           'fill="#555"/></marker></defs>']
    for i, label in enumerate(panel.lane_labels):
        top, h = lane_top[i], panel.rows[i] * _ROW
        fill = "#f4f4f4" if i % 2 == 0 else "#fafafa"
        out.append(f'<rect x="{_LEFT}" y="{top - 2}" width="{span}" height="{h + 4}" '
                   f'fill="{fill}"/>')
        out.append(f'<text class="lane" x="{_LEFT - 8}" y="{top + h / 2 + 4:.1f}" '
                   f'text-anchor="end" font-weight="600">{html.escape(label)}</text>')
    for tick in _ticks(panel.end):
        out.append(f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{_TOP - 2}" '
                   f'y2="{height - _AXIS + 2}" stroke="#ddd"/>')
        out.append(f'<text x="{x(tick):.1f}" y="{height - 10}" text-anchor="middle" '
                   f'fill="#555">{html.escape(fmt_seconds(tick) if tick else "0")}</text>')
    centers: dict[int, tuple[float, float]] = {}
    # short bars last, so that a neighbour never hides them
    for bar in sorted(panel.bars, key=lambda b: (b.event["end"] - b.event["start"]) * scale
                      >= span * MIN_BAR, reverse=True):
        e = bar.event
        x0 = x(e["start"])
        w = max(span * MIN_BAR, (min(e["end"], panel.end) - e["start"]) * scale)
        top = lane_top[bar.lane] + bar.row * _ROW
        centers[id(bar)] = (top + _ROW / 2, top)
        tip = (f"{e['node']} ({bar.kind}) step {e['step']}: {fmt_seconds(e['start'])} → "
               f"{fmt_seconds(e['end'])} ({fmt_seconds(e['end'] - e['start'])})"
               f" on {', '.join(str(g) for g in occupied_groups(e) if g) or NO_GROUP}")
        color = KIND_COLORS.get(bar.kind, OTHER_COLOR)
        out.append(f'<g><title>{html.escape(tip)}</title><rect class="bar" x="{x0:.1f}" '
                   f'y="{top + 1}" width="{w:.1f}" height="{_ROW - 3}" rx="2" fill="{color}" '
                   f'stroke="#fff" stroke-width=".5"/>')
        label = _label(e, w)
        if label:
            out.append(f'<text x="{x0 + w / 2:.1f}" y="{top + _ROW / 2 + 3:.1f}" '
                       f'text-anchor="middle" fill="#111">{html.escape(label)}</text>')
        out.append("</g>")
    for gen, train in panel.flows():
        (y0, _), (y1, _) = centers[id(gen)], centers[id(train)]
        x0, x1 = x(gen.event["end"]), x(train.event["start"])
        bend = max(12.0, abs(x1 - x0) / 3)
        out.append(f'<path class="flow" fill="none" stroke="#555" stroke-opacity=".6" '
                   f'd="M{x0:.1f},{y0:.1f} C{x0 + bend:.1f},{y0:.1f} '
                   f'{x1 - bend:.1f},{y1:.1f} {x1:.1f},{y1:.1f}" '
                   f'marker-end="url(#arrow{index})"/>')
    out.append("</svg>")
    return "\n".join(out)


def _label(event: Mapping[str, Any], width_px: float) -> str:
    """The bar's text: 'node step' when it fits, the step alone when that fits, else none."""
    full = f"{event['node']} {event['step']}"
    if width_px >= 6.2 * len(full) + 6:
        return full
    step = str(event["step"])
    return step if width_px >= 6.2 * len(step) + 4 else ""


def render_html(plan: Plan, measured: list[dict] | None = None,
                drawn_steps: int = DRAWN_STEPS) -> str:
    """The timeline page: header with the plan's figures, a legend, one SVG per panel."""
    panels = _panels(plan, measured, drawn_steps)
    name = html.escape(plan.name)
    sched = plan.schedule
    kinds = sorted({bar.kind for panel in panels for bar in panel.bars},
                   key=lambda k: list(KIND_COLORS).index(k) if k in KIND_COLORS else 99)
    groups = " · ".join(
        f"<b>{html.escape(g.name)}</b> {g.gpus} × [{html.escape(', '.join(g.tasks))}]"
        for g in plan.placement.groups)
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>rlgraph timeline: {name}</title><style>{_CSS}</style></head><body>",
        f"<h1>{name}</h1>",
        f'<div class="facts">{" · ".join(html.escape(p) for p in _headline(plan))}</div>',
    ]
    if sched.bottleneck:
        parts.append(f'<div class="muted">{html.escape(sched.bottleneck)}</div>')
    if groups:
        parts.append(f'<div class="muted">groups: {groups}</div>')
    parts.append('<p class="legend">' + "".join(
        f'<span><i style="background:{KIND_COLORS.get(k, OTHER_COLOR)}"></i>'
        f'{html.escape(k)}</span>' for k in kinds) + "</p>")
    for i, panel in enumerate(panels):
        parts.append(f"<h2>{html.escape(panel.title)} <span class='muted'>"
                     f"{html.escape(panel.caption)}</span></h2>")
        parts.append(_svg(panel, i))
    parts.append(
        '<p class="muted">Arrows join generate(t) to train(t): a batch generated while an '
        "earlier train step still runs is the off-policy lag. Hover a bar for its times. "
        "timeline.json holds every event; it opens in Perfetto (ui.perfetto.dev) or "
        "chrome://tracing.</p></body></html>")
    return "\n".join(parts)


# ---------------------------------------------------------------- PNG


def render_png(path: Path, plan: Plan, measured: list[dict] | None = None,
               drawn_steps: int = DRAWN_STEPS) -> Path:
    """The same panels as the HTML, drawn with matplotlib (Agg, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    panels = _panels(plan, measured, drawn_steps)
    # fixed margins in inches (constrained layout would double the drawing time)
    lane_h, top, bottom, gap = 0.42, 0.62, 0.8, 0.75
    heights = [lane_h * (sum(p.rows) + 0.4 * (len(p.rows) - 1) + 0.4) for p in panels]
    fig_h = top + bottom + sum(heights) + gap * (len(panels) - 1)
    label_w = 0.3 + 0.075 * max(len(label) for p in panels for label in p.lane_labels or [""])
    fig = Figure(figsize=(PNG_WIDTH_IN, fig_h), dpi=PNG_DPI)
    fig.subplots_adjust(left=label_w / PNG_WIDTH_IN, right=1 - 0.2 / PNG_WIDTH_IN,
                        top=1 - top / fig_h, bottom=bottom / fig_h,
                        hspace=gap / (sum(heights) / len(panels)))
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    title = f"{plan.name}: " + " · ".join(_headline(plan))
    fig.text(0.5, 1 - 0.12 / fig_h, title, ha="center", va="top", fontsize=12,
             fontweight="bold")
    for ax, panel in zip(axes, panels):
        _draw_panel(ax, panel)
    kinds = sorted({b.kind for p in panels for b in p.bars},
                   key=lambda k: list(KIND_COLORS).index(k) if k in KIND_COLORS else 99)
    fig.legend(handles=[Patch(color=KIND_COLORS.get(k, OTHER_COLOR), label=k) for k in kinds],
               loc="lower center", bbox_to_anchor=(0.5, 0.02 / fig_h), ncol=len(kinds),
               frameon=False, fontsize=9)
    fig.savefig(path)
    return path


def _draw_panel(ax: Any, panel: Panel) -> None:
    """One panel on a matplotlib Axes: lanes top to bottom, labelled bars, flow arrows."""
    bottoms, y = [], 0.0
    for rows in panel.rows:
        bottoms.append(y)
        y += rows + 0.4
    total = y - 0.4

    def row_y(bar: Bar) -> float:  # matplotlib's y grows upwards; lanes read top-down
        return total - bottoms[bar.lane] - bar.row - 1

    width_px = PNG_WIDTH_IN * PNG_DPI * 0.85
    for bar in panel.bars:
        e = bar.event
        stop = min(e["end"], panel.end)
        short = stop - e["start"] < panel.end * MIN_BAR  # drawn wider, and on top
        ax.barh(row_y(bar) + 0.5, max(stop - e["start"], panel.end * MIN_BAR), left=e["start"],
                height=0.85, color=KIND_COLORS.get(bar.kind, OTHER_COLOR), edgecolor="white",
                linewidth=0 if short else 0.5, zorder=3 if short else 2)
        label = _label(e, (stop - e["start"]) / panel.end * width_px)
        if label:
            ax.text((e["start"] + stop) / 2, row_y(bar) + 0.5, label, ha="center",
                    va="center", fontsize=7.5)
    for gen, train in panel.flows():
        ax.annotate("", xy=(train.event["start"], row_y(train) + 0.5),
                    xytext=(gen.event["end"], row_y(gen) + 0.5),
                    arrowprops={"arrowstyle": "->", "color": "#555", "lw": 0.7, "alpha": 0.55,
                                "connectionstyle": "arc3,rad=0.15"})
    ax.set_yticks([total - b - rows / 2 for b, rows in zip(bottoms, panel.rows)],
                  panel.lane_labels, fontsize=9)
    ax.set_ylim(-0.2, total + 0.2)
    ax.set_xlim(0, panel.end)
    ax.set_title(f"{panel.title} · {panel.caption}", fontsize=10, loc="left")
    ax.xaxis.set_major_formatter(lambda v, _: fmt_seconds(v) if v else "0")
    ax.grid(axis="x", color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


# ---------------------------------------------------------------- files


def write_timeline(out_dir: Path, plan: Plan, measured: list[dict] | None = None,
                   png: bool = True) -> list[Path]:
    """Write timeline.json (predicted), timeline.html and (with `png`) timeline.png into
    out_dir; returns the paths written.

    With `measured` (event dicts from a run's trace.json) the HTML and PNG show the
    predicted and the measured timeline one above the other.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trace = chrome_trace(plan.schedule.events, plan.name, plan.placement.names,
                         kinds=plan.kinds)
    sched = plan.schedule
    trace["otherData"].update({k: getattr(sched, k) for k in
                               ("period_s", "bound_s", "sync_period_s", "speedup_vs_sync")})
    paths = [out_dir / "timeline.json", out_dir / "timeline.html"]
    paths[0].write_text(json.dumps(trace))
    paths[1].write_text(render_html(plan, measured))
    if png:
        paths.append(out_dir / "timeline.png")
        render_png(paths[2], plan, measured)
    return paths
