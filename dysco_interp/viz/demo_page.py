"""The main job's page: one offline HTML file that shows what DySCO did on one instance.

From top to bottom: what ran and what was measured over many instances (the verdict), the route
steps teacher-forced (where the QRHeads and all heads looked, what DySCO selected, each method's
log-probability of the step's city), the replay of the gold route token by token, and the replay
of the two free generations side by side. plotly.js is loaded once, from the shared copy beside
the page (`render_html.shared_plotlyjs`); every plot's width follows the window.
"""

from __future__ import annotations

import html
from pathlib import Path

from dysco_interp.atomic import atomic_open
from dysco_interp.experiments.demo import DemoResult, config_label, route_score_text, step_cells, verdict
from dysco_interp.viz.render_html import PLOTLYJS_NAME, shared_plotlyjs
from dysco_interp.viz.replay_view import replay_figure

METHOD_COLORS = {"vanilla": "#9d9d9d", "dysco": "#e45756"}
HEAD_COLORS = {"QRHeads": "#4c78a8", "all heads": "#72b7b2"}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1400px; padding: 0 16px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.92em; } td, th { padding: 4px 10px; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.verdict { background: #fff8e6; border-left: 4px solid #f58518; padding: 8px 12px; }
.verdict.shows { background: #eef6ee; border-left-color: #54a24b; }
pre { background: #f7f7f7; padding: 8px; white-space: pre-wrap; }
.routes { display: flex; gap: 16px; flex-wrap: wrap; } .routes > div { flex: 1 1 300px; }
"""


def step_figure(demo: DemoResult):
    """Per route step: the gold edge's attention (QRHeads vs all heads) and the city's log-probability
    under each method (hollow bar: the argmax did not name the city)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    steps = demo.steps
    labels = [f"step {s.step + 1}<br>→ {html.escape(s.city.strip())}" for s in steps]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "attention on the step's gold edge line", "log p(city name), teacher-forced"))
    for name, values in (("QRHeads", [s.qr_mass for s in steps]), ("all heads", [s.all_mass for s in steps])):
        ranks = [s.qr_rank if name == "QRHeads" else s.all_rank for s in steps]
        fig.add_trace(go.Bar(x=labels, y=values, name=name, marker_color=HEAD_COLORS[name], legendgroup="heads",
                             text=[f"rank {r}" for r in ranks], textposition="outside",
                             hovertemplate="%{y:.3f} (%{text} of " + str(demo.instance.n_edges) + " edges)"),
                      row=1, col=1)
    for method in ("vanilla", "dysco"):
        right = [s.correct[method] for s in steps]
        fig.add_trace(go.Bar(
            x=labels, y=[s.logprob[method] for s in steps], name=f"{method} log p(city)", legendgroup="methods",
            marker={"color": [METHOD_COLORS[method] if r else "white" for r in right],
                    "line": {"color": METHOD_COLORS[method], "width": 2}},
            customdata=["argmax names it" if r else "argmax does not name it" for r in right],
            hovertemplate="%{y:.2f} nats, %{customdata}"), row=1, col=2)
    fig.add_hline(y=0, line_color="#444", line_width=1, row=1, col=2)
    fig.update_yaxes(title_text="attention mass", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="nats (0 = certain)", row=1, col=2)
    fig.update_layout(barmode="group", height=430, autosize=True, plot_bgcolor="white",
                      margin={"t": 60, "b": 90, "l": 70, "r": 20},
                      legend={"orientation": "h", "x": 0, "y": -0.2, "yanchor": "top", "font": {"size": 13}})
    fig.update_yaxes(gridcolor="#eee")
    fig.update_xaxes(tickangle=0)
    return fig


def _plot(fig, div_id: str, plotlyjs: str | bool) -> str:
    # plotlyjs: the script's src for the page's first plot, False for the others
    return fig.to_html(full_html=False, include_plotlyjs=plotlyjs, div_id=div_id, config={"responsive": True},
                       auto_play=False)


# the page's step table: (cell of `step_cells`, header, right-aligned number)
STEP_COLUMNS = (("step", "step", False), ("edge", "gold edge", False), ("qr", "QRHeads on it", True),
                ("all", "all heads on it", True), ("outside", "QRHeads outside every edge", True),
                ("selected", "DySCO selected", True), ("vanilla", "log p(city) vanilla", True),
                ("dysco", "DySCO", True), ("right", "argmax names it (vanilla / DySCO)", False))


def _step_rows(demo: DemoResult) -> str:
    head = "<tr>" + "".join(f"<th>{title}</th>" for _, title, _ in STEP_COLUMNS) + "</tr>"
    rows = ["<tr>" + "".join(f"<td{' class=num' if num else ''}>{html.escape(cells[key])}</td>"
                             for key, _, num in STEP_COLUMNS) + "</tr>"
            for cells in step_cells(demo)]
    return f"<table>{head}{''.join(rows)}</table>"


def demo_page(demo: DemoResult, plotlyjs: str = PLOTLYJS_NAME) -> str:
    """The page's HTML; `plotlyjs` is the relative path it loads plotly.js from."""
    inst = demo.instance
    totals = demo.totals
    measured = demo.measured
    total_line = ""
    if totals:
        v, d = totals["vanilla"], totals["dysco"]
        total_line = (f"<p>Step accuracy (argmax names the city): vanilla <b>{v['step_accuracy']:.2f}</b>, DySCO "
                      f"<b>{d['step_accuracy']:.2f}</b>. Mean log p(city): vanilla {v['city_logprob']:+.2f}, DySCO "
                      f"{d['city_logprob']:+.2f} nats.</p>")
    routes = "".join(
        f"<div><h3>{html.escape(name)}</h3><p>{html.escape(route_score_text(demo.scores[name], inst.n_hops))}</p>"
        f"<pre>{html.escape(res.text)}</pre></div>" for name, res in demo.results.items())
    same = demo.results["vanilla"].tokens == demo.results["dysco"].tokens
    title_lines = demo.title.split("\n")
    return "\n".join([
        "<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title_lines[0])}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title_lines[0])}</h1>",
        f"<p>{html.escape(title_lines[1])}<br>Question: {html.escape(inst.question_nl)}<br>"
        f"DySCO: {html.escape(demo.config.method)}, {html.escape(config_label(demo.config))}, "
        f"{len(demo.heads)} QRHeads ({html.escape(', '.join(demo.heads.labels()))}).</p>",
        f"<p class='verdict{' shows' if measured is not None and measured.shows else ''}'>"
        f"{html.escape(verdict(demo))}</p>",
        "<h2>1. Teacher-forced on the gold route: where the heads look, and what DySCO changes</h2>",
        "<p>Each step is read at the position that predicts its destination city, with the gold route so far "
        "fed. Attention is the mean over heads of that row summed over the gold edge's line; rank 1 is the "
        "most attended of the edges. DySCO selected: the share of the gold edge's tokens that got log β.</p>",
        _step_rows(demo), total_line,
        _plot(step_figure(demo), "demo-steps", plotlyjs),
        "<h2>2. The gold route, token by token</h2>",
        "<p>Every token of the gold answer: attention per edge line (QRHeads and all heads) of the row that "
        "predicts it, and the share of each line DySCO selected at that step.</p>",
        _plot(replay_figure({"gold route, teacher-forced": demo.forced_replay}, demo.title), "demo-gold-replay",
              False),
        "<h2>3. Free greedy generation</h2>",
        f"<div class='routes'>{routes}</div>",
        "<p>Vanilla and DySCO wrote the same tokens on this instance.</p>" if same else "",
        _plot(replay_figure(demo.replays, demo.title), "demo-free-replay", False),
        "</body></html>",
    ])


def write_demo_page(demo: DemoResult, path: str | Path) -> Path:
    """Write the page as one HTML file that opens offline, with the shared plotly.min.js beside it."""
    path = Path(path)
    page = demo_page(demo, shared_plotlyjs(path))
    with atomic_open(path) as f:
        f.write(page)
    return path


__all__ = ["demo_page", "step_figure", "write_demo_page"]
