"""The view stage: rows, batches and rollout samples that show themselves, as HTML for
Jupyter, text for terminals and matplotlib plots.

What a row looks like to the model, one call away::

    # a sketch: row is an encoded MultiModalInputs, batch a collated batch (docs/how-to/jupyter.md)
    row                      # in Jupyter: MultiModalInputs._repr_html_ -> row_html(row)
    print(row.describe())    # terminal: lengths, grids, token spans, the token text
    batch                    # per-row table (length, padding, images, tokens per image) + rows

One pipeline for every family (patch grids, tiles, the generic path): what differs per kind of
family (where a row's media tokens are, how a span is labelled, how pictures come out of the
stored pixels) is asked of the row's media strategy (``fam.media.view_*``, `mmpipe.media`).

- **Images** are shown as the model sees them, from the stored pixels: a patch-grid row's
  resized images (compact uint8 rows via `mmpipe.images.unpatchify_u8`, float32 rows by
  inverting the normalisation table exactly), a tiled row's stored tiles (one thumbnail per
  tile). Rows without pictures (``pixels="none"``, the generic path's processor outputs) get
  a labelled placeholder box of the image's aspect instead (never an ``<img>``).
- **Tokens** form a strip coloured by modality. Each image's tokens are ONE labelled span
  ("image k · grid t×h×w · n tokens", "image k · H×W px · n tiles · t tokens"; class
  ``mmpipe-image-span``, ``data-image="k"``) in the colour of that image's thumbnail border;
  videos likewise (``mmpipe-video-span``; Qwen3-VL splits a video into one span per frame
  group). Long text runs collapse to head/tail tokens with "… n tokens …"; image spans are
  never collapsed. Tokens with ``labels != -100`` (what the loss trains on) are underlined in
  green.
- Token text comes from ``tokenizer`` (a tokenizer or a processor, each token decoded on its
  own); without one the token ids are shown, unless `set_default_processor` named one (then
  plain ``row`` in Jupyter shows text too). A processor also supplies the normalisation
  constants for float32 rows (default: the family's).

All HTML is escaped, styled by one inline ``<style>`` block, with no JavaScript and no
external resource: `html_page` wraps it into a standalone document for a browser.

=============  ==============================================================================
module         what it shows
=============  ==============================================================================
``spans``      `token_spans` (a row's text / image / video runs), token text, `set_default_processor`
``images``     `image_thumbnails`, `video_frames`, `media_colour` (pixels as the model sees them)
``summary``    a row's head-line facts, `batch_table_rows` (shared by HTML and text)
``html``       `row_html`, `batch_html`, `rollout_html`, `to_html`, `html_page`
``text``       `describe`
``plots``      `plot_positions`, `plot_image_grid` (matplotlib, imported when a plot is drawn)
``style``      the one inline ``<style>`` block
=============  ==============================================================================

Importing this package registers `row_html`, `batch_html`, `rollout_html` and `describe` in
`mmpipe.records.display_hooks`, which the records' ``_repr_html_`` / ``describe`` use (records
never import the view stage); ``import mmpipe`` imports it.
"""

from mmpipe.records import display_hooks as _hooks
from mmpipe.view.html import (
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_TOKENS,
    batch_html,
    html_page,
    rollout_html,
    row_html,
    to_html,
)
from mmpipe.view.images import image_thumbnails, media_colour, video_frames
from mmpipe.view.plots import plot_image_grid, plot_positions
from mmpipe.view.spans import Span, set_default_processor, token_spans
from mmpipe.view.summary import batch_table_rows
from mmpipe.view.text import describe

_hooks.register("row_html", row_html)
_hooks.register("batch_html", batch_html)
_hooks.register("rollout_html", rollout_html)
_hooks.register("describe", describe)

__all__ = [
    "DEFAULT_MAX_ROWS", "DEFAULT_MAX_TOKENS", "Span", "batch_html", "batch_table_rows", "describe", "html_page",
    "image_thumbnails", "media_colour", "plot_image_grid", "plot_positions", "rollout_html", "row_html",
    "set_default_processor", "to_html", "token_spans", "video_frames",
]
