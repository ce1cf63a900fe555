"""The main job's page: one offline HTML file that shows what DySCO did on one instance.

From top to bottom: what ran and what was measured over many instances (the verdict), the
measured effect (the selection-budget study's test table and its effect-against-budget curves,
from the numbers shipped with the package: `experiments.evidence`), the route steps
teacher-forced (where the QRHeads and all heads looked, what DySCO selected, each method's
log-probability of the step's city), the replay of the gold route token by token, and the replay
of the two free generations side by side. plotly.js is loaded once, from the shared copy beside
the page (`render_html.shared_plotlyjs`); every plot's width follows the window.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from dysco_interp.analysis.report import fmt_ci, fmt_delta
from dysco_interp.atomic import atomic_open
from dysco_interp.experiments.demo import (
    METHOD_LABELS,
    SHOWCASE_MODEL,
    DemoResult,
    config_label,
    config_words,
    route_score_text,
    step_cells,
    verdict,
)
from dysco_interp.experiments.evidence import load_evidence
from dysco_interp.tasks.lengths import length_label
from dysco_interp.viz.budget_figure import budget_panels
from dysco_interp.viz.render_html import PLOTLYJS_NAME, panels_figure, shared_plotlyjs
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
code { background: #f0f0f0; padding: 1px 4px; border-radius: 3px; font-size: 0.95em; }
table.evidence td, table.evidence th { white-space: nowrap; } tr.this td { font-weight: bold; }
p.note { color: #555; font-size: 0.9em; }
"""
EVIDENCE_FIGURE_PX = 520  # the effect-against-budget panels: small, the table is the headline


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
            x=labels, y=[s.logprob[method] for s in steps], name=f"{METHOD_LABELS[method]} log p(city)",
            legendgroup="methods", showlegend=False,
            marker={"color": [METHOD_COLORS[method] if r else "white" for r in right],
                    "line": {"color": METHOD_COLORS[method], "width": 2}},
            customdata=["argmax names it" if r else "argmax does not name it" for r in right],
            hovertemplate="%{y:.2f} nats, %{customdata}"), row=1, col=2)
    # legend-only entries: a bar's fill varies per bar (a plotly legend shows the first bar's),
    # so each method's colour and what a fill means get entries of their own
    for name, symbol, color, group in (
            *((f"{METHOD_LABELS[m]} log p(city)", "square", METHOD_COLORS[m], "methods") for m in METHOD_COLORS),
            ("filled bar: the argmax names the city", "square", "#666", "fill"),
            ("hollow bar: the argmax names another token", "square-open", "#666", "fill")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, legendgroup=group,
                                 hoverinfo="skip", marker={"symbol": symbol, "size": 14, "color": color,
                                                           "line": {"width": 2, "color": color}}), row=1, col=2)
    fig.add_hline(y=0, line_color="#444", line_width=1, row=1, col=2)
    fig.update_yaxes(title_text="attention mass", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="nats (0 = certain)", row=1, col=2)
    fig.update_layout(barmode="group", height=430, autosize=True, plot_bgcolor="white",
                      margin={"t": 60, "b": 90, "l": 70, "r": 20},
                      legend={"orientation": "h", "x": 0, "y": -0.2, "yanchor": "top", "font": {"size": 13},
                              "traceorder": "grouped"})
    fig.update_yaxes(gridcolor="#eee")
    fig.update_xaxes(tickangle=0)
    return fig


def with_code(text: str) -> str:
    """Escaped text whose `backticked` spans (commands to copy) become <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def evidence_rows(model: str) -> list[dict]:
    """The measured effect as table rows: each model's test split per length, and the demo's model's
    own run where it is only measured elsewhere (the default model: the dev split). `this` marks the
    demo's model."""
    evidence = load_evidence()
    rows = []
    small = evidence["small"].get(model)
    if small is not None:
        rows.append({"model": model, "split": small["split"], "length": small["length"], "n": small["n"],
                     "config": small["config"], "vanilla": small["vanilla"][evidence["metric"]],
                     "dysco": small["dysco"][evidence["metric"]], "delta": small["delta"][evidence["metric"]],
                     "source": small["source"], "this": True})
    for name, measured in evidence["test"]["models"].items():
        rows += [{"model": name, "split": evidence["test"]["split"], **r, "config": measured["config"],
                  "source": evidence["test"]["source"], "this": name == model} for r in measured["rows"]]
    return rows


def evidence_table(model: str) -> str:
    """The rows of `evidence_rows`; a DySCO settings column only when the rows' settings differ
    (the section's text names them otherwise)."""
    rows = evidence_rows(model)
    settings = len({config_words(r["config"]) for r in rows}) > 1
    head = "".join(f"<th>{t}</th>" for t in ("model", "split", "prompt tokens", "n", "vanilla [95% CI]",
                                             "DySCO [95% CI]", "DySCO − vanilla, paired [95% CI]")
                   + (("DySCO settings",) if settings else ()))
    body = "".join(
        f"<tr{' class=this' if r['this'] else ''}><td>{html.escape(r['model'])}</td><td>{r['split']}</td>"
        f"<td class=num>{length_label(r['length']).upper()}</td><td class=num>{r['n']}</td>"
        f"<td class=num>{fmt_ci(r['vanilla'])}</td><td class=num>{fmt_ci(r['dysco'])}</td>"
        f"<td class=num>{fmt_delta(r['delta'])}</td>"
        + (f"<td>{html.escape(config_words(r['config']))}</td>" if settings else "") + "</tr>"
        for r in rows)
    return f"<table class=evidence>{head}{body}</table>"


def evidence_figure():
    """The dev sweep's paired gain in step accuracy against the cap K (`viz.budget_figure`'s panels,
    drawn from the shipped rows): where the small budget was chosen."""
    evidence = load_evidence()
    rows = evidence["curves"]["rows"]
    panels, ncols = budget_panels(rows, "K")
    n = sorted({r["n"] for r in rows})
    fig = panels_figure(panels, ncols=ncols, title=(
        f"{evidence['curves']['split']} split, teacher forced: gain in step accuracy over vanilla against the cap K "
        f"({'/'.join(map(str, n))} instances per cell, 95% paired CI)"))
    fig.update_layout(height=EVIDENCE_FIGURE_PX + 2 * 120, autosize=True, title_font_size=14)
    return fig


def evidence_section(demo: DemoResult, plotlyjs: str | bool) -> list[str]:
    evidence = load_evidence()
    model = demo.model
    covered = model in evidence["test"]["models"] or model in evidence["small"]
    lead = (f"Rows in bold are {html.escape(model)}'s." if covered else
            f"No study covers {html.escape(model)}; these are the models that were measured.")
    settings = sorted({config_words(r["config"]) for r in evidence_rows(model)})
    return [
        "<h2>1. The effect over many instances (measured, not this run)</h2>",
        f"<p>Teacher-forced step accuracy on Path Traversal (the share of route steps whose city the argmax "
        f"names, the gold route so far fed): vanilla and small-budget DySCO ({html.escape('; '.join(settings))}), "
        f"and their paired difference over the same instances. {lead} The settings were chosen on the dev "
        f"split and reported on the test split; {SHOWCASE_MODEL} shows the clearest effect.</p>",
        evidence_table(model),
        f"<p class=note>{html.escape(evidence['ci'])}. Sources: "
        f"{html.escape(', '.join(dict.fromkeys(r['source'] for r in evidence_rows(model))))} "
        f"(the selection-budget study, figures/README.md), shipped with the package.</p>",
        "<p>Where the small budget comes from: the gain against how many keys DySCO may boost (the cap K) on "
        "the dev split. It is largest at a few keys and fades or turns negative as K grows; random heads "
        "instead of the QRHeads lose.</p>",
        _plot(evidence_figure(), "demo-evidence", plotlyjs),
        f"<p class=note>Path Traversal only; the full figure, with MRCR (where almost every setting lowers the "
        f"gold answer's log-probability), is figures/budget/effect.png ({html.escape(evidence['curves']['source'])}"
        f" has the numbers).</p>",
    ]


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
        f"<div><h3>{html.escape(METHOD_LABELS[name])}</h3>"
        f"<p>{html.escape(route_score_text(demo.scores[name], inst.n_hops))}</p>"
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
        f"{with_code(verdict(demo))}</p>",
        *evidence_section(demo, plotlyjs),
        "<h2>2. Teacher-forced on the gold route: where the heads look, and what DySCO changes</h2>",
        "<p>Each step is read at the position that predicts its destination city, with the gold route so far "
        "fed. Attention is the mean over heads of that row summed over the gold edge's line; rank 1 is the "
        "most attended of the edges. DySCO selected: the share of the gold edge's tokens that got log β.</p>",
        _step_rows(demo), total_line,
        _plot(step_figure(demo), "demo-steps", False),
        "<h2>3. The gold route, token by token</h2>",
        "<p>Every token of the gold answer: attention per edge line (QRHeads and all heads) of the row that "
        "predicts it, and the share of each line DySCO selected at that step.</p>",
        _plot(replay_figure({"gold route, teacher-forced": demo.forced_replay}, demo.title), "demo-gold-replay",
              False),
        "<h2>4. Free greedy generation</h2>",
        f"<div class='routes'>{routes}</div>",
        "<p>Vanilla and DySCO wrote the same tokens on this instance.</p>" if same else "",
        _plot(replay_figure({METHOD_LABELS[k]: r for k, r in demo.replays.items()}, demo.title), "demo-free-replay",
              False),
        "</body></html>",
    ])


def write_demo_page(demo: DemoResult, path: str | Path) -> Path:
    """Write the page as one HTML file that opens offline, with the shared plotly.min.js beside it."""
    path = Path(path)
    page = demo_page(demo, shared_plotlyjs(path))
    with atomic_open(path) as f:
        f.write(page)
    return path


__all__ = ["demo_page", "evidence_figure", "evidence_rows", "evidence_section", "evidence_table", "step_figure",
           "with_code", "write_demo_page"]
