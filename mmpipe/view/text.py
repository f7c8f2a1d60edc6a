"""Rows, batches and rollout samples as plain text for terminals (view stage): `describe`.
One layout for every family: a span's label from the row's items in one typed form
(`mmpipe.records.media_layout.MediaLayout`), the head line's extras also from its media strategy
(`mmpipe.media`)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe.batching.unbatch import unbatch
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX, to_numpy
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.spans import CONTINUED, Span, TokenText, collapse_plan, position_ranges, span_label, token_spans
from mmpipe.view.summary import as_row, batch_table_rows, count_list, row_summary, size_notes


def _shown(s: Span, image_ids: Sequence[int], video_ids: Sequence[int]) -> int:
    """The number a span's media shows (its index in the batch), -1 for unaccounted tokens."""
    ids = image_ids if s.kind == "image" else video_ids
    return ids[s.index] if 0 <= s.index < len(ids) else -1


def _token_line(row: MultiModalInputs, row_spans: list[Span], toks: TokenText, max_tokens: Optional[int],
                image_ids: Sequence[int], video_ids: Sequence[int]) -> str:
    """The sequence as one line: decoded text (or ids), media as [image k · ...], trained
    tokens between ⟦ ⟧."""
    labels = None if row.labels is None else np.asarray(row.labels)
    ids = np.asarray(row.input_ids)
    out, trained_open = [], False
    sep = "" if toks.tok is not None else " "
    split = toks.split_chars(ids)  # characters split over byte-level tokens, shown whole

    def mark(trained: bool):
        nonlocal trained_open
        if trained != trained_open:
            out.append("⟦" if trained else "⟧")
            trained_open = trained

    for item in collapse_plan(row_spans, max_tokens):
        if isinstance(item, Span):
            s = item
            mark(labels is not None and bool((labels[s.start:s.end] != IGNORE_INDEX).any()))
            out.append(f"{sep}[{span_label(row, s, _shown(s, image_ids, video_ids))}]{sep}")
        elif item[0] == "gap":
            out.append(f"{sep}… {item[1]} tokens …{sep}")
        else:
            i = item[1]
            mark(labels is not None and int(labels[i]) != IGNORE_INDEX)
            shown = split.get(i)
            out.append("" if shown == CONTINUED else toks.shown(int(ids[i]), shown) + sep)
    mark(False)
    return "".join(out).strip()


def _describe_row(row: MultiModalInputs, toks: TokenText, max_tokens, image_ids=None, video_ids=None,
                  title="MultiModalInputs", indent="") -> list[str]:
    """A head line, one line per media span (label, the kind's notes, token range, positions),
    a line per image whose tokens are not marked, and the token line (trained ones between ⟦ ⟧)."""
    image_ids = list(range(row.num_images)) if image_ids is None else list(image_ids)
    video_ids = list(range(row.num_videos)) if video_ids is None else list(video_ids)
    row_spans = token_spans(row)
    lines = [f"{indent}{title}: {row_summary(row, ', ')}"]
    spanned = set()
    for s in row_spans:
        if s.kind == "text":
            continue
        spanned.update((s.kind, k) for k in range(s.index, max(s.last, s.index) + 1))
        notes = size_notes(row, s.kind, s.index) if s.index >= 0 else []
        where = [f"tokens [{s.start}, {s.end})"]
        if np.ndim(row.position_ids) == 2:  # M-RoPE: each axis's range tells the image's place
            where.append("positions " + " ".join(position_ranges(row, s.start, s.end)))
        label = span_label(row, s, _shown(s, image_ids, video_ids))
        lines.append(f"{indent}  " + ", ".join([label, *notes, *where]))
    for k in range(row.num_images):
        if ("image", k) not in spanned:  # the generic path: the processor's placeholders are not marked
            lines.append(f"{indent}  image {image_ids[k]} · {row.media_layout().label(k)}, "
                         "its tokens are not marked (mm_token_type_ids)")
    if row.pixel_format == "none" and (row.num_images or row.num_videos):
        lines.append(f"{indent}  (layout-only row: no pixels stored)")
    how = " (trained ones, labels != -100, between ⟦ ⟧)" if row.labels is not None else ""
    lines.append(f"{indent}  tokens{how}: {_token_line(row, row_spans, toks, max_tokens, image_ids, video_ids)}")
    return lines


def _describe_batch(batch: BatchedMultiModalInputs, toks: TokenText, max_tokens) -> list[str]:
    """A head line, the per-row table (`batch_table_rows`), then each row."""
    rows = unbatch(batch)
    info = batch_table_rows(batch, rows)
    B, L = batch.input_ids.shape
    n_img, n_vid = int(to_numpy(batch.image_offsets)[-1]), sum(len(r["videos"]) for r in info)
    lines = [f"BatchedMultiModalInputs: {batch.family}, B={B} rows x L={L}, {n_img} images"
             f"{f', {n_vid} videos' if n_vid else ''}, padding {batch.padding_side}, pixels {batch.pixel_format}"]
    head = ("#", "length", "padding", "images", "tokens/image", "layouts", "labels")
    table = [head]
    for r in info:
        table.append((
            str(r["row"]), str(r["length"]), str(r["padding"]),
            f"{len(r['images'])} {r['images']}" + (f" +videos {r['videos']}" if r["videos"] else ""),
            count_list(r["tokens_per_image"]).replace(" ", "") or "-",
            "; ".join(r["layouts"]) or "-",
            f"yes ({r['trained_tokens']} trained)" if r["has_labels"] else "no",
        ))
    widths = [max(len(t[c]) for t in table) for c in range(len(head))]
    for t in table:
        lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
    for b, row in enumerate(rows):
        lines += _describe_row(row, toks, max_tokens, info[b]["images"], info[b]["videos"], f"row {b}", "  ")
    return lines


def describe(obj, *, tokenizer=None, max_tokens: Optional[int] = 120) -> str:
    """Plain-text description for terminals of a row, batch or rollout sample (or a list), of
    any family.

    Rows: a head line (tokens by modality, images, pixel storage, labels), one line per image
    (its label: grid, or size and tiles; resized size, token range, position ranges) and the
    token sequence (decoded with ``tokenizer``, else ids; long text runs collapsed beyond
    ``max_tokens``; trained tokens between ⟦ ⟧). Batches: a per-row table (length, padding,
    images, tokens per image, layouts, labels), then each row.
    """
    toks = TokenText(tokenizer)
    if isinstance(obj, (list, tuple)):
        return "\n".join(describe(o, tokenizer=tokenizer, max_tokens=max_tokens) for o in obj)
    if isinstance(obj, BatchedMultiModalInputs):
        return "\n".join(_describe_batch(obj, toks, max_tokens))
    if isinstance(obj, RolloutSample):
        lp = None if obj.logprobs is None else to_numpy(obj.logprobs).astype(np.float64)  # bf16 too
        R = len(obj.response_ids)
        stats = f", logprobs mean {lp.mean():.4f} min {lp.min():.4f}" if (lp is not None and R) else ""
        lines = [f"RolloutSample: prompt {obj.prompt_index} sample {obj.sample_index}, finish {obj.finish_reason}"
                 + (f" ({obj.stop_reason})" if obj.stop_reason is not None else "")
                 + f", {obj.prompt.num_tokens} prompt + {R} response tokens{stats}"]
        lines += _describe_row(obj.to_row(), toks, max_tokens, title="prompt+response", indent="  ")
        return "\n".join(lines)
    return "\n".join(_describe_row(as_row(obj), toks, max_tokens))
