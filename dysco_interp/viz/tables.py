"""The one table writer: a GitHub markdown table, and a self-contained HTML page with a table."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path


def check_rows(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    if any(len(r) != len(headers) for r in rows):
        raise ValueError(f"every row needs {len(headers)} cells")


def table_markdown(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table ending in a newline; `|` inside cells is escaped, newlines become spaces."""
    check_rows(headers, rows)

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def table_html(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    path: str | Path,
    *,
    title: str,
    classes: Sequence[Sequence[str | None]] | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """One self-contained HTML page with a table; `classes` ("good", "bad", "muted") colour cells."""
    check_rows(headers, rows)
    if classes is not None and (len(classes) != len(rows) or any(len(c) != len(headers) for c in classes)):
        raise ValueError("classes must have the table's shape")
    esc = html.escape
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, value in enumerate(row):
            cls = classes[r][c] if classes is not None else None
            cells.append(f"<td{f' class={chr(34)}{esc(cls)}{chr(34)}' if cls else ''}>{esc(str(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; font-size: 13px; }}
th {{ background: #f0f0f0; }}
td.good {{ background: #e5f5e0; }}
td.bad {{ background: #fde0dd; }}
td.muted {{ color: #888; }}
</style></head><body>
<h2>{esc(title)}</h2>
{''.join(f'<p>{esc(n)}</p>' for n in notes)}
<table><thead><tr>{''.join(f'<th>{esc(str(h))}</th>' for h in headers)}</tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table>
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
