"""The figure and tables of one first-error record: per-edge attention bars (QRHeads vs all
heads, gold edge and the edges into the written city marked), and the gold / vanilla / DySCO
routes side by side (Markdown, HTML, JSON). Drawing needs the stored record only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dysco_interp.paths import safe_component
from dysco_interp.tasks.lengths import length_label
from dysco_interp.viz.figures import save_bars
from dysco_interp.viz.panels import BarPanel
from dysco_interp.viz.tables import table_html, table_markdown


def stem_of(record: dict) -> str:
    """The file stem of a record's outputs: one file-name component, whatever the record says."""
    return safe_component(f"{record['model']}_{length_label(record['length'])}_{record['index']}")


def edge_label(e: dict) -> str:
    return f"{e['src']} → {e['dst']}"


def draw_attention(record: dict, out_dir: Path) -> list[Path]:
    name = "city" if "city" in record["queries"] else "divergence"
    q = record["queries"][name]
    gold = record["gold_edge"]
    also = " (also into the written city)" if gold in record["followed_edges"] else ""
    marks = {gold: f"gold edge (step {record['step'] + 1}){also}"}  # first: the first mark colour
    marks.update({i: "edge into the written city" for i in record["followed_edges"] if i != gold})
    panels = [
        BarPanel(f"QRHeads ({len(record['heads'])} heads, mean)", "attention mass", q["qrheads"],
                 q["summary"]["qrheads"]["top5pct_cutoff"], "top-5% cut-off"),
        BarPanel("all heads (mean)", "attention mass", q["all_heads"],
                 q["summary"]["all_heads"]["top5pct_cutoff"], "top-5% cut-off"),
    ]
    what = "the city" if name == "city" else "the first wrong token"
    title = (f"{record['model']}, {record['n_tokens']} tokens, instance {record['index']}: vanilla first goes wrong "
             f"at step {record['step'] + 1}\nattention where it writes {what} {q['wrote'].strip()!r} "
             f"(gold city: {record['gold_city']!r})")
    stem = out_dir / stem_of(record)
    return list(save_bars(panels, [edge_label(e) for e in record["edges"]], stem, title=title,
                          xlabel="edge lines in context order", marks=marks))


def _cell(row: dict | None) -> tuple[str, str | None]:
    if row is None or row["written"] is None:
        return "(nothing)", "muted"
    mark = {"right": "✓", "wrong": "✗", "extra": "+"}[row["verdict"]]
    note = f" ({row['edge']})" if row["verdict"] != "right" and row["edge"] else ""
    return f"{mark} {row['written']}{note}", {"right": "good", "wrong": "bad", "extra": "muted"}[row["verdict"]]


def route_table(record: dict) -> tuple[list[str], list[list[str]], list[list[str | None]]]:
    """Headers, rows and cell classes of the gold / vanilla / DySCO side-by-side table."""
    methods = [m for m in ("vanilla", "dysco") if m in record["routes"]]
    lines = {m: record["routes"][m]["lines"] for m in methods}
    n = max(len(record["gold_route"]), *(len(v) for v in lines.values()))
    headers = ["step", "gold route"] + [{"vanilla": "vanilla", "dysco": "DySCO"}[m] for m in methods]
    rows, classes = [], []
    for i in range(n):
        gold = record["gold_route"][i] if i < len(record["gold_route"]) else ""
        cells = [_cell(lines[m][i] if i < len(lines[m]) else None) for m in methods]
        rows.append([str(i + 1), gold] + [c[0] for c in cells])
        classes.append([None, None, *(c[1] for c in cells)])
    return headers, rows, classes


def draw_routes(record: dict, out_dir: Path) -> list[Path]:
    headers, rows, classes = route_table(record)
    stem = out_dir / f"{stem_of(record)}_routes"
    title = f"{record['model']}, {record['n_tokens']} tokens, instance {record['index']}: {record['question']}"
    note = ("✓ equals the gold line, ✗ differs (with whether the written step is an edge of the context), "
            "+ past the gold route.")
    md = stem.with_name(stem.name + ".md")
    md.write_text(f"**{title}**\n\n" + table_markdown(headers, rows) + f"\n{note}\n", encoding="utf-8")
    html = table_html(headers, rows, stem.with_name(stem.name + ".html"), title=title, classes=classes, notes=[note])
    js = stem.with_name(stem.name + ".json")
    js.write_text(json.dumps({"question": record["question"], "gold": record["gold_route"],
                              **{m: r for m, r in record["routes"].items()}}, indent=1, ensure_ascii=False) + "\n")
    return [md, html, js]


def draw(record: dict, out_dir: Path, command: str, figures: bool = True) -> list[Path]:
    """The record as JSON, then (unless `figures` is off) its bar figure and route table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem_of(record)}.json"
    path.write_text(json.dumps({**record, "command": command}, indent=1, ensure_ascii=False) + "\n")
    written = [path]
    if figures:
        try:
            written += draw_attention(record, out_dir)
        except ImportError as e:
            print(f"not drawing ({e.name} is not installed); draw later with --figures-only", file=sys.stderr)
        written += draw_routes(record, out_dir)
    return written


def describe(record: dict) -> str:
    lines = [f"instance {record['index']} ({record['id']}): {record['question']}",
             f"first wrong step {record['step'] + 1}: wrote {record['first_error']['line']['text']!r}; "
             f"gold {record['first_error']['gold_line']!r}"]
    for name, q in record["queries"].items():
        s = q["summary"]
        lines.append(f"  at the {name} token {q['wrote']!r} (reproduced: {q['reproduced']}): gold edge rank "
                     f"QRHeads {s['qrheads']['gold_rank']}/{record['n_edges']} (mass {s['qrheads']['gold_mass']:.4f}), "
                     f"all heads {s['all_heads']['gold_rank']}/{record['n_edges']} "
                     f"(mass {s['all_heads']['gold_mass']:.4f}); "
                     f"QRHeads' top edge: {edge_label(record['edges'][s['qrheads']['top_edge']])}")
    return "\n".join(lines)
