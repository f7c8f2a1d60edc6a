"""The ``processor`` kind (the generic path: a VLM processor without a family row of its own,
`mmpipe.media.processor_encode`): a row holds what the processor's own call returned, typed by the
processor's `ProcessorLayout` (found once by a probe): its sequence keys (int [L], e.g.
``token_type_ids``) in ``sequence``, its other outputs (float32 ``pixel_values``, masks, sizes)
in ``vision``, and each image's upright (height, width) in ``image_hw``. Positions: 1-D
``0..n-1`` where the processor's model takes them, else the model computes its own
(`position_inputs`, `mmpipe.model_rope`).

Stored columns: `COLUMNS`; each key of the layout is a column of its own (`_outputs`). Rows
written before the one-record change have no ``image_hw``: they load, and their image count is
unknown (``num_images`` counts 0; re-encode for per-image indices).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.audio.clips import stored_sources
from mmpipe.errors import ArgumentError, InputError
from mmpipe.media.defaults import position_inputs as one_d_position_inputs
from mmpipe.records.codec import FAMILY, Column, check_token_shapes, stored_row_error
from mmpipe.records.columns import as_array
from mmpipe.records.processor_layout import LAYOUT_COLUMN, ProcessorLayout  # noqa: F401  (the layout type)
from mmpipe.records.vision_tokens import named_tokens

SHAPES_COLUMN = "generic_shapes"  # the stored shape of each vision key (layout order)

IMAGE_LAYOUT_COLUMN = "image_hw"  # the stored per-image layout (what error messages name)


def _layout(r) -> ProcessorLayout:
    """The row's layout (a row built without one: the layout of its own outputs)."""
    return r.layout or ProcessorLayout.of(r.processor_class or "", r.sequence, r.vision)


def _outputs(r) -> dict:
    """The stored processor outputs, every key of the row's layout (empty where the row has
    none): sequence keys int32 [L], vision keys flat in the processor's dtype (``list<float32>``
    pixels, ``list<int64>`` sizes, bool or int64 masks), their shapes in `SHAPES_COLUMN`."""
    layout = _layout(r)
    out = {k: r.sequence[k].astype(np.int32) if k in r.sequence else np.zeros(len(r), np.int32)
           for k in layout.sequence}
    for name, dtype, _ in layout.vision:
        out[name] = r.vision[name].reshape(-1) if name in r.vision else np.zeros(0, dtype)
    return out


def _shapes(r) -> list:
    """Each vision key's shape in this row, layout order (``[0]`` where the row has none)."""
    return [list(r.vision[n].shape) if n in r.vision else [0] for n, _, _ in _layout(r).vision]


COLUMNS = (  # the stored columns, in order (`mmpipe.records.codec.Column`)
    Column("input_ids", "int32"), Column("attention_mask", "int8"), Column("labels", "int32", missing="none"),
    _outputs,
    Column(SHAPES_COLUMN, "object", read=None, value=_shapes),
    Column("image_hw", "int64", ndim=2, width=2, flat=True, missing="none"), FAMILY,  # family "generic"
    Column(LAYOUT_COLUMN, "object", read=None, value=lambda r: _layout(r).to_json()),
    Column("audio_sources", "object", read=None, missing="none",  # audio="source": each clip's file bytes
           value=lambda r: None if r.audio_sources is None else [bytes(b) for b in r.audio_sources]),
)
HAS_PIXELS = ("float32",)  # the processor's vision outputs
CHECK_ON_READ = True  # every row read is validated (no digest: the float outputs are stored as they are)


def read_media(d, kw: dict, fam, row) -> dict:
    """What `COLUMNS` leave to this kind: the layout, its sequence keys (int64 [L]) and its vision
    keys in their stored shapes (a key stored empty, shape [0], is a key the row does not have)."""
    layout = ProcessorLayout.from_json(d.get(LAYOUT_COLUMN), row)
    shapes = [] if d.get(SHAPES_COLUMN) is None else list(d.get(SHAPES_COLUMN))
    if len(shapes) != len(layout.vision):
        raise stored_row_error(f"{SHAPES_COLUMN} holds {len(shapes)} shapes for {len(layout.vision)} vision keys",
                               row, SHAPES_COLUMN)
    vision = {}
    for (name, dtype, _), shape in zip(layout.vision, shapes):
        shape = [int(n) for n in shape]
        if shape and shape[0]:
            arr = as_array(d.get(name), dtype, 1, name, row)
            if arr.size != int(np.prod(shape)):
                raise stored_row_error(f"column {name!r} holds {arr.size} values for shape {shape}", row, name,
                                       f"{int(np.prod(shape))} values", str(arr.size))
            vision[name] = arr.reshape(shape)
    return dict(layout=layout, vision=vision, audio_sources=stored_sources(d.get("audio_sources"), row),
                sequence={k: as_array(d.get(k), np.int64, 1, k, row) for k in layout.sequence})


def validate(r, row: Any = None) -> None:
    """The lengths of the sequence keys and the leading axis of the row keys."""
    check_token_shapes(r, row, stage="encode", fix="pass the processor outputs of this very row")
    for name in r.row_keys:
        if r.vision[name].shape[:1] != (1,):
            raise InputError(f"{name} is a per-row output but holds {r.vision[name].shape[0]} rows", row=row,
                             column=name, stage="encode", expected="axis 0 of length 1",
                             found=f"shape {r.vision[name].shape}", fix="encode one row per processor call")


def layout_repr(r) -> str:
    return f"processor={r.processor_class}"


def position_inputs(batch, positions) -> dict:
    """``position_ids`` [B, L] (``0..n-1`` per row) only where the processor's model takes 1-D
    positions (`mmpipe.model_rope.model_rope`, from transformers' tables by the stored
    processor class: old rows too). ``positions``: None (default) -> those 1-D positions for a
    1-D model, none for a model with multi-dimensional or unknown positions (the model computes
    them itself from ids, masks and grids, as with the processor's own batch); "none" -> none;
    "1d" -> 1-D positions, an `ArgumentError` for a multi-dimensional rope (they would be wrong)."""
    from mmpipe.model_rope import model_rope

    rope = model_rope(batch.processor_class or "")
    if positions == "1d" and rope.kind == "multi":
        raise ArgumentError(
            f"positions='1d' for {rope.processor_class}: its model's rope is multi-dimensional ({rope.detail}); "
            "1-D positions [B, L] would give it wrong positions at every image; pass positions=None (the "
            "default) or 'none' to let the model compute its own")
    if positions is None and not rope.one_d:
        positions = "none"
    return one_d_position_inputs(batch, positions)


def model_inputs(batch, token_types=None) -> dict:
    """The processor's own outputs: its sequence keys [B, L] and every vision key (in the
    processor's dtype: `ProcessorLayout.model_tensors`); ``use_audio_in_video=True`` for a batch
    holding videos: the generic path encodes videos only with their sound (`TAKES_VIDEO_SOUND`), and the
    Omni thinker's rope needs the flag to position them (it changes nothing for the batch's rows
    without videos)."""
    out = {**batch.sequence, **(batch.layout.model_tensors(batch.vision) if batch.layout else batch.vision)}
    grids = batch.vision.get("video_grid_thw")
    if grids is not None and len(grids):
        out["use_audio_in_video"] = True
    return out


# ---- rollout ----
NO_ROLLOUT = ("the generic path (a processor without a mmpipe family table) has no rollout rules beyond "
              "generation with mmpipe.rollout.TransformersEngine and vLLM prompts for the Omni thinkers "
              "(mmpipe.rollout.processor_prompts): no other vLLM prompt (placeholder) rule, no way to "
              "extend its processor-defined outputs over a response; generate with TransformersEngine, train on "
              "its rows with mmpipe.Collator(processor), or add a family row for its processor class "
              "(mmpipe.families) to roll it out")
NO_VLLM_ENGINE = ("VLLMEngine does not take generic-path rows: build their prompts with "
                  "mmpipe.rollout.to_vllm_prompts(rows, processor) (the Omni thinkers) and call vLLM's generate "
                  "yourself, or generate with mmpipe.rollout.TransformersEngine")


def vision_tokens(fam, processor: Any = None) -> dict[str, Optional[str]]:
    """The tokens a sampled response must not hold: the generic path has no table, so the ones
    ``processor`` (or its tokenizer) names itself (`mmpipe.records.vision_tokens.named_tokens`;
    {} without a processor or names)."""
    return named_tokens(processor)


# Generation (``TransformersEngine``) takes the generic path's rows: the model computes its own
# positions and the processor's named media tokens are banned; so do vLLM prompts, built for the Omni
# thinkers and refused per processor for the others (`mmpipe.rollout.processor_prompts`); every other
# rollout stage refuses them (`NO_ROLLOUT`), `VLLMEngine` saying so its own way (`NO_VLLM_ENGINE`)
ROLLOUT_REFUSED = {"vllm_engine": NO_VLLM_ENGINE, "samples": NO_ROLLOUT, "multiturn": NO_ROLLOUT, "verl": NO_ROLLOUT}


# ---- encode, collate: what the stages ask beyond these functions is in mmpipe/media/processor_{encode,probe,
# collate,view}.py (`mmpipe.media.KINDS`: the layout of the processor's outputs, ``encode_layout``, is the
# probe's; 1-D positions where exact, float pixels: `mmpipe.media.defaults`)
VLLM_PROMPT = "processor"  # the Omni thinkers' per-processor prompts (`mmpipe.rollout.vllm_prompts`)
BATCH_ROWS = "generic-path"  # a batch of this kind's rows, in error messages
FOREIGN_ROW = "a natively encoded row"  # a row of another kind in such a batch
TAKES_AUDIO = True  # a processor with a feature extractor gets the row's clips (`mmpipe.audio.load_audio`)
# ``Encoder(use_audio_in_video=True)``: videos with their sound (the Omni thinkers, `mmpipe.encoding.video_sound`)
TAKES_VIDEO_SOUND = True


# ---- validate ----
KIND_COLUMN = LAYOUT_COLUMN  # only processor rows store it (names a table without a family)


def _stored_layout(text: Any) -> Optional[ProcessorLayout]:
    """A stored layout, None when unreadable (reading its rows reports it)."""
    try:
        return ProcessorLayout.from_json(text)
    except InputError:
        return None


def expected_columns(table, *, labels: bool, pixel_format: str) -> list:
    """The declared columns (`COLUMNS`, `mmpipe.data.validate_columns.declared_columns`) and the
    keys the rows' layouts name (the processor's own dtypes: not checked; a missing one fails its
    rows)."""
    from mmpipe.data.column_rules import ExpectedColumn
    from mmpipe.data.validate_columns import declared_columns

    fixed = declared_columns(table, COLUMNS, "processor")
    has_layouts = LAYOUT_COLUMN in table.column_names
    texts = table.column(LAYOUT_COLUMN).unique().to_pylist() if has_layouts else []
    layouts = [x for x in map(_stored_layout, texts) if x is not None]
    # without a row there is no layout: any column may be one of the processor's
    keys = {k for x in layouts for k in x.sequence + tuple(v[0] for v in x.vision)} if texts \
        else set(table.column_names)
    keys -= {c.name for c in fixed}
    return fixed + [ExpectedColumn(k, if_missing="optional") for k in sorted(keys)]


def dataset_checks(table, processor=None) -> list:
    """One processor layout per dataset (a batch is collated with one layout): an error naming
    the first row of each other layout."""
    from mmpipe.data.report import Issue

    first: dict = {}
    for i, text in enumerate(table.column(LAYOUT_COLUMN).to_pylist()):
        first.setdefault(text, i)
    layouts = [_stored_layout(t) for t in first]
    classes = ", ".join(sorted({"an unreadable layout" if x is None else x.processor_class
                                for x in layouts}))
    old = [] if "image_hw" in table.column_names or not table.num_rows else [Issue(
        "warning", "missing_column", "image_hw", "rows of an earlier mmpipe store no image_hw: which row owns "
        "which image is unknown (a batch's sample_to_image_indices refuses); ids, pixels and model inputs are "
        "right", "re-encode the dataset with mmpipe.encode (or `mmpipe encode`), which stores each image's size")]
    settings = {x.settings for x in layouts if x is not None and x.settings}
    what = f"; {len(settings)} different image-processor settings ({', '.join(sorted(settings))})" \
        if len(settings) > 1 else ""
    return old + [Issue("error", "content", LAYOUT_COLUMN, f"rows encoded by {len(first)} different "
                  f"processor layouts ({classes}{what}): a batch is collated with one layout",
                  "encode every row with one processor, or split the dataset",
                  sorted(first.values())[1:])] if len(first) > 1 else old
