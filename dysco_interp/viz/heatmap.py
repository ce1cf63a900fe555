"""The head-score heatmap: x = query head, y = layer (layer 0 at the top), as a PNG and as
HTML that opens offline. Unscored heads (-1, TransformerLens' head_detector convention, or a
False entry of `scored`) are blank on grey; `highlight` heads (e.g. the top-k) are framed.

matplotlib and plotly are imported inside the functions, when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from dysco_interp.hooks import NOT_SCORED
from dysco_interp.viz.render_html import write_plotly
from dysco_interp.viz.render_png import agg_figure, save_png

UNSCORED_COLOR = "#d9d9d9"


def head_score_grid(scores, scored=None) -> np.ndarray:
    """[L, H] float array with NaN where a head was not scored.

    `scores` is a tensor/array/nested list; without `scored`, exactly NOT_SCORED (-1) means unscored.
    """
    grid = np.array(scores.tolist() if hasattr(scores, "tolist") else scores, dtype=float)
    if grid.ndim != 2 or grid.size == 0:
        raise ValueError(f"head scores must be a non-empty [n_layers, n_heads] matrix, got shape {grid.shape}")
    if scored is None:
        mask = grid == NOT_SCORED
    else:
        mask = ~np.array(scored.tolist() if hasattr(scored, "tolist") else scored, dtype=bool)
    if mask.shape != grid.shape:
        raise ValueError(f"scored mask {mask.shape} does not match scores {grid.shape}")
    grid[mask] = np.nan
    return grid


def head_scores_title(model: str | None, method: str, n_examples: int | None = None) -> str:
    extra = f", {n_examples} examples" if n_examples else ""
    return f"{method} head scores: {model or 'model'}{extra}"


def highlighted(highlight: Iterable[Sequence[int]] | None) -> list[tuple[int, int]]:
    return [(int(h[0]), int(h[1])) for h in (highlight or [])]


def highlight_label(marks: Sequence[tuple[int, int]], ranked: bool = False) -> str:
    """The legend entry of the framed heads; the HTML also writes each one's rank in its frame."""
    return f"top-{len(marks)} heads (framed{', number = rank' if ranked else ''})"


def head_scores_png(
    scores,
    path: str | Path,
    *,
    title: str,
    scored=None,
    highlight: Iterable[Sequence[int]] | None = None,
    cmap: str = "viridis",
) -> Path:
    """Write the heatmap as a PNG; `highlight` heads (e.g. the top-k) get a red frame."""
    return save_png(head_scores_figure(scores, title=title, scored=scored, highlight=highlight, cmap=cmap), path,
                    dpi=120)


def head_scores_figure(
    scores,
    *,
    title: str,
    scored=None,
    highlight: Iterable[Sequence[int]] | None = None,
    cmap: str = "viridis",
):
    """The heatmap as a matplotlib figure, framed heads named in a legend under it."""
    import matplotlib
    from matplotlib.patches import Rectangle

    grid = head_score_grid(scores, scored)
    n_layers, n_heads = grid.shape
    marks = highlighted(highlight)
    fig = agg_figure(max(5.0, 0.28 * n_heads + 2.5), max(3.0, 0.22 * n_layers + 1.5) + (0.4 if marks else 0.0))
    fig.set_layout_engine("constrained")  # keeps the legend under the axes inside the image
    ax = fig.add_subplot()
    ax.set_facecolor(UNSCORED_COLOR)
    colors = matplotlib.colormaps[cmap].with_extremes(bad=UNSCORED_COLOR)
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=colors, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="score")
    for layer, head in marks:
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.2))
    if marks:
        frame = Rectangle((0, 0), 1, 1, fill=False, edgecolor="red", linewidth=1.2, label=highlight_label(marks))
        # below the heatmap: over it, the legend would hide heads
        ax.legend(handles=[frame], loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=9, frameon=False)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    step = max(1, math.ceil(n_heads / 16))
    ax.set_xticks(range(0, n_heads, step))
    ax.set_yticks(range(0, n_layers, max(1, math.ceil(n_layers / 24))))
    return fig


def head_scores_html(
    scores,
    path: str | Path,
    *,
    title: str,
    scored=None,
    highlight: Iterable[Sequence[int]] | None = None,
) -> Path:
    """Write the heatmap as one HTML file that opens offline (the shared plotly.js copy beside it, no CDN)."""
    return write_plotly(head_scores_plotly(scores, title=title, scored=scored, highlight=highlight), path)


def head_scores_plotly(scores, *, title: str, scored=None, highlight: Iterable[Sequence[int]] | None = None):
    """The heatmap as a plotly figure; framed heads are one legend entry, their rank written in each frame."""
    import plotly.graph_objects as go

    grid = head_score_grid(scores, scored)
    n_layers, n_heads = grid.shape
    # Plain lists (not numpy): plotly writes the numbers as JSON text, readable in the file.
    z = [[None if math.isnan(v) else float(v) for v in row] for row in grid]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            colorscale="Viridis",
            colorbar={"title": {"text": "score"}},
            hovertemplate="L%{y}H%{x}: %{z:.4f}<extra></extra>",
            hoverongaps=False,
        )
    )
    marks = highlighted(highlight)
    if marks:
        fig.add_trace(
            go.Scatter(
                x=[h for _, h in marks],
                y=[layer for layer, _ in marks],
                mode="markers+text",
                text=[str(i + 1) for i in range(len(marks))],
                textfont={"color": "white", "size": 9},
                marker={"symbol": "square-open", "color": "red", "size": 14, "line": {"width": 2}},
                name=highlight_label(marks, ranked=True),
                hovertemplate="rank %{text}: L%{y}H%{x}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        # the grid's own edges (the frames' markers would otherwise widen the axes past it)
        xaxis={"title": {"text": "head"}, "dtick": 1 if n_heads <= 32 else None, "range": [-0.5, n_heads - 0.5]},
        yaxis={"title": {"text": "layer"}, "range": [n_layers - 0.5, -0.5]},
        plot_bgcolor=UNSCORED_COLOR,  # unscored cells are gaps, so they show this grey
        showlegend=bool(marks),
        # under the heatmap, clear of the colour bar's title
        legend={"orientation": "h", "x": 0.5, "xanchor": "center", "y": 0, "yanchor": "bottom", "yref": "container"},
        margin={"b": 110},
        height=max(500, 22 * n_layers + 260),
    )
    return fig


def heatmap_paths(out: str | Path) -> tuple[Path, Path]:
    """<stem>_heatmap.png and <stem>_heatmap.html next to `out`."""
    out = Path(out)
    return out.with_name(f"{out.stem}_heatmap.png"), out.with_name(f"{out.stem}_heatmap.html")


def save_head_heatmaps(
    scores,
    out: str | Path,
    *,
    model: str | None,
    method: str,
    scored=None,
    highlight: Iterable[Sequence[int]] | None = None,
    n_examples: int | None = None,
) -> tuple[Path, Path]:
    """Both formats next to `out` (see heatmap_paths); returns (png, html)."""
    title = head_scores_title(model, method, n_examples)
    png, html = heatmap_paths(out)
    marks = highlighted(highlight)
    return (
        head_scores_png(scores, png, title=title, scored=scored, highlight=marks),
        head_scores_html(scores, html, title=title, scored=scored, highlight=marks),
    )
