"""matplotlib views of a row: its position rows along the sequence (the three M-RoPE rows,
or the one row of 1-D positions), and a patch-grid image's tokens laid out on its merged grid.

::

    from mmpipe.view.plots import plot_positions, plot_image_grid
    plot_positions(row)               # t, h, w positions vs token index; image spans shaded
    plot_positions(batch, index=2)    # row 2 of a batch (padding stripped)
    plot_image_grid(row, 0)           # image 0 with one cell per token: "#index (t,h,w)"
    fig.savefig("positions.png")

Both return a ``matplotlib.figure.Figure`` (the one of ``ax`` when given). Figures are made
without pyplot: no global state, no display needed (Agg draws them when saved), and in
Jupyter the returned figure shows itself once, as a PNG. matplotlib is imported only when a
plot is made.
"""

from __future__ import annotations

import io

import numpy as np

from mmpipe.errors import ArgumentError
from mmpipe.view.images import image_thumbnails, media_colour
from mmpipe.view.spans import AXES, token_spans
from mmpipe.view.summary import as_row
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.batch import BatchedMultiModalInputs

_AXIS_COLOURS = ("#1f77b4", "#d62728", "#2ca02c")
MAX_CELL_LABELS = 144  # image tokens labelled one by one up to this many


def _row_of(obj, index: int = 0) -> MultiModalInputs:
    """A row from a row, stored dict, batch (row ``index``, padding stripped) or rollout sample."""
    from mmpipe.records.rollout import RolloutSample

    if isinstance(obj, BatchedMultiModalInputs):
        from mmpipe.batching.unbatch import unbatch

        if not 0 <= index < obj.batch_size:
            raise IndexError(f"row index {index} out of range for a batch of {obj.batch_size} rows")
        return unbatch(obj)[index]
    if isinstance(obj, RolloutSample):
        return obj.to_row()
    return as_row(obj)


_FIGURE_CLASS = None


def _figure_class():
    """A matplotlib ``Figure`` that shows itself in Jupyter (``_repr_png_``) without pyplot:
    made on first use so that matplotlib is imported only when a plot is drawn."""
    global _FIGURE_CLASS
    if _FIGURE_CLASS is None:
        try:
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("mmpipe.view.plots needs matplotlib: pip install 'mmpipe[plots]' (or matplotlib)") from e

        class PlotFigure(Figure):
            def _repr_png_(self) -> bytes:
                buf = io.BytesIO()
                self.savefig(buf, format="png", dpi=100)
                return buf.getvalue()

        _FIGURE_CLASS = PlotFigure
    return _FIGURE_CLASS


def _figure(figsize):
    """A new pyplot-free figure and its axes (no global state; Agg draws it when saved)."""
    fig = _figure_class()(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def plot_positions(row_or_batch, *, index: int = 0, ax=None):
    """The position rows against the token index: M-RoPE's three (t, h, w), or the one row
    of 1-D positions (tiled families, the generic path).

    Args:
        row_or_batch: a `MultiModalInputs`, stored row dict, `BatchedMultiModalInputs`
            (row ``index``) or `RolloutSample` (prompt + response).
        ax: draw into this matplotlib Axes instead of a new figure.

    One line per position row (``ax.lines[0..2]`` hold x = token index, y =
    ``position_ids[0..2]`` exactly; ``ax.lines[0]`` the 1-D positions); each image's (video's)
    tokens are shaded in its colour from `mmpipe.view.images.media_colour` and labelled; trained tokens (labels != -100) are marked by a bar under the axis.
    Returns the Figure.
    """
    row = _row_of(row_or_batch, index)
    if ax is None:
        fig, ax = _figure((10, 3.4))
    else:
        fig = ax.figure
    pos = np.asarray(row.position_ids).reshape(-1, row.num_tokens)  # [P, L]: 3 M-RoPE rows or 1
    x = np.arange(row.num_tokens)
    names = AXES if len(pos) == len(AXES) else ("",) * len(pos)
    for a in range(len(pos)):
        ax.plot(x, pos[a], label=f"{names[a]} position".strip(), color=_AXIS_COLOURS[a % len(_AXIS_COLOURS)],
                lw=1.4, marker="." if row.num_tokens <= 400 else None, ms=3, drawstyle="default")
    top = float(pos.max()) if row.num_tokens else 1.0
    for s in token_spans(row):
        if s.kind == "text":
            continue
        colour = media_colour(max(s.index, 0), s.kind)
        ax.axvspan(s.start - 0.5, s.end - 0.5, color=colour, alpha=0.18, lw=0)
        part = f" ({s.part + 1}/{s.parts})" if s.parts > 1 else ""
        ax.text((s.start + s.end - 1) / 2, top, f"{s.kind} {s.index}{part}", ha="center", va="bottom",
                fontsize=8, color=colour, clip_on=False)
    if row.labels is not None:
        trained = np.flatnonzero(np.asarray(row.labels) != IGNORE_INDEX)
        if len(trained):
            ax.scatter(trained, np.full(len(trained), -0.04 * max(top, 1.0)), marker="|", color="#1f8a3b",
                       s=30, label="trained (labels != -100)", zorder=3)
    ax.set_xlabel("token index")
    ax.set_ylabel("position id")
    rope = f"M-RoPE positions · {row.family} · {row.num_tokens} tokens · rope_delta {row.rope_delta}"
    ax.set_title(rope if len(pos) == len(AXES) else f"positions · {row.family} · {row.num_tokens} tokens",
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    ax.grid(alpha=0.25)
    return fig


def plot_image_grid(row, image_index: int = 0, *, ax=None, spec=None, labels="auto"):
    """Image ``image_index`` (as the model sees it, from the stored pixels) with its merged
    grid drawn over it: one cell per token (``merge x merge`` patches), each labelled with its
    token index in the row and its (t, h, w) position.

    Args:
        row: a `MultiModalInputs`, stored row dict or `RolloutSample`.
        spec: a `VisionSpec` or processor for float32 rows (see `mmpipe.view.images.image_thumbnails`).
        labels: True, False or "auto" (label cells when the image has at most
            `MAX_CELL_LABELS` tokens).

    A layout-only row has no pixels: a grey box of the resized size stands in. Rows without
    patch grids (tiled families, the generic path) raise `ArgumentError`: `row_html` and
    `image_thumbnails` show their images. Returns the Figure.
    """
    row = _row_of(row)
    if not 0 <= image_index < row.num_images:
        raise IndexError(f"image index {image_index} out of range: the row holds {row.num_images} images")
    spans = [s for s in token_spans(row) if s.kind == "image" and s.index == image_index]
    if image_index >= len(row.image_grid_thw) or not spans:
        raise ArgumentError(f"plot_image_grid draws an image's tokens on its patch grid, and image {image_index} of "
                            f"this {row.family} row has no patch grid (image_grid_thw) or no tokens of its own; "
                            "row_html(row) and image_thumbnails(row) show its pictures")
    fam = row.fam
    p, m = fam.patch_size, fam.merge_size
    t, gh, gw = (int(v) for v in np.asarray(row.image_grid_thw)[image_index])
    H, W = gh * p, gw * p
    span = spans[0]
    img = image_thumbnails(row, spec=spec)[image_index]
    if ax is None:
        fig, ax = _figure((max(3.0, min(9.0, 6.0 * W / max(H, W))) + 0.6, max(3.0, min(9.0, 6.0 * H / max(H, W)))))
    else:
        fig = ax.figure
    colour = media_colour(image_index)
    if img is not None:
        ax.imshow(np.asarray(img), extent=(0, W, H, 0), interpolation="nearest")
        note = ""
    else:
        from matplotlib.patches import Rectangle

        ax.add_patch(Rectangle((0, 0), W, H, facecolor="#e6e6e6", edgecolor="#888", hatch="//"))
        ax.text(W / 2, H / 2, "no pixels stored\n(layout-only row)", ha="center", va="center", fontsize=9)
        note = " · layout only"
    rows_m, cols_m = gh // m, gw // m
    n_tok = rows_m * cols_m
    _draw_token_grid(ax, W, H, p, m, colour)
    if (n_tok <= MAX_CELL_LABELS) if labels == "auto" else bool(labels):
        _label_token_cells(ax, np.asarray(row.position_ids), span.start, rows_m, cols_m, p * m)
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.set_aspect("equal")
    ax.set_xlabel(f"x (px) · {cols_m} token columns")
    ax.set_ylabel(f"y (px) · {rows_m} token rows")
    ax.set_title(f"image {image_index} · grid {t}×{gh}×{gw} · {n_tok} tokens #{span.start}–#{span.end - 1} · "
                 f"{W}×{H} px{note}", fontsize=9)
    return fig


def _draw_token_grid(ax, W: int, H: int, p: int, m: int, colour: str) -> None:
    """Patch boundaries inside each token cell thin, token cells (merge x merge patches) bold."""
    cell = p * m
    inner_x = [x for x in range(p, W, p) if x % cell]
    inner_y = [y for y in range(p, H, p) if y % cell]
    ax.vlines(inner_x, 0, H, colors=colour, lw=0.4, alpha=0.5)
    ax.hlines(inner_y, 0, W, colors=colour, lw=0.4, alpha=0.5)
    ax.vlines(np.arange(0, W + 1, cell), 0, H, colors=colour, lw=1.0)
    ax.hlines(np.arange(0, H + 1, cell), 0, W, colors=colour, lw=1.0)


def _label_token_cells(ax, pos: np.ndarray, first: int, rows_m: int, cols_m: int, cell: int) -> None:
    """Each token cell labelled ``#index (t,h,w)``; ``pos`` int64 [3, L], ``first`` the image's
    first token (tokens follow the merged grid row by row)."""
    size = max(4.0, min(9.0, 60.0 / max(rows_m, cols_m)))
    for i in range(rows_m):
        for j in range(cols_m):
            k = first + i * cols_m + j
            ax.text((j + 0.5) * cell, (i + 0.5) * cell, f"#{k}\n({pos[0, k]},{pos[1, k]},{pos[2, k]})",
                    ha="center", va="center", fontsize=size, color="white",
                    bbox=dict(boxstyle="round,pad=0.15", fc="black", alpha=0.45, lw=0))
