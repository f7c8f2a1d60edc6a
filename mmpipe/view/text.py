"""Rows, batches and rollout samples as plain text for terminals (view stage): `describe`."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe.batching.unbatch import unbatch
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.row import MultiModalInputs
from mmpipe.view.spans import Span, TokenText, collapse_plan, span_label, token_spans, value_range
from mmpipe.view.summary import as_row, batch_table_rows, grid_str, row_summary
from mmpipe.view.tiled import as_tiled, describe_tiled


def _token_line(row: MultiModalInputs, row_spans: list[Span], toks: TokenText, max_tokens: Optional[int],
                image_ids: Sequence[int], video_ids: Sequence[int]) -> str:
    """The sequence as one line: decoded text (or ids), media as [image k · ...], trained
    tokens between ⟦ ⟧."""
    labels = None if row.labels is None else np.asarray(row.labels)
    ids = np.asarray(row.input_ids)
    out, trained_open = [], False
    sep = "" if toks.tok is not None else " "

    def mark(trained: bool):
        nonlocal trained_open
        if trained != trained_open:
            out.append("⟦" if trained else "⟧")
            trained_open = trained

    for item in collapse_plan(row_spans, max_tokens):
        if isinstance(item, Span):
            s = item
            kind_ids = image_ids if s.kind == "image" else video_ids
            shown = Span(s.kind, s.start, s.end, kind_ids[s.index] if 0 <= s.index < len(kind_ids) else -1,
                         s.grid, s.part, s.parts)
            mark(labels is not None and bool((labels[s.start:s.end] != IGNORE_INDEX).any()))
            out.append(f"{sep}[{span_label(shown)}]{sep}")
        elif item[0] == "gap":
            out.append(f"{sep}… {item[1]} tokens …{sep}")
        else:
            i = item[1]
            mark(labels is not None and int(labels[i]) != IGNORE_INDEX)
            out.append((toks.shown(int(ids[i])) if toks.tok is not None else str(int(ids[i]))) + sep)
    mark(False)
    return "".join(out).strip()


def _describe_row(row: MultiModalInputs, toks: TokenText, max_tokens, image_ids=None, video_ids=None,
                  title="MultiModalInputs", indent="") -> list[str]:
    image_ids = list(range(row.num_images)) if image_ids is None else list(image_ids)
    video_ids = list(range(row.num_videos)) if video_ids is None else list(video_ids)
    row_spans = token_spans(row)
    lines = [f"{indent}{title}: {row_summary(row)}"]
    pos = np.asarray(row.position_ids)
    p = row.fam.patch_size
    for s in row_spans:
        if s.kind == "text":
            continue
        ids = image_ids if s.kind == "image" else video_ids
        k = ids[s.index] if 0 <= s.index < len(ids) else -1
        shown = Span(s.kind, s.start, s.end, k, s.grid, s.part, s.parts)
        size = f", {s.grid[2] * p}×{s.grid[1] * p} px" if s.grid is not None else ""
        q = pos[:, s.start:s.end]
        lines.append(f"{indent}  {span_label(shown)}{size}, tokens [{s.start}, {s.end}), "
                     f"positions t {value_range(q[0])} h {value_range(q[1])} w {value_range(q[2])}")
    if not row.has_pixels and (row.num_images or row.num_videos):
        lines.append(f"{indent}  (layout-only row: no pixels stored)")
    lines.append(f"{indent}  tokens: {_token_line(row, row_spans, toks, max_tokens, image_ids, video_ids)}")
    if row.labels is not None:
        lines.append(f"{indent}  (trained tokens, labels != -100, between ⟦ ⟧)")
    return lines


def describe(obj, *, tokenizer=None, max_tokens: Optional[int] = 120) -> str:
    """Plain-text description for terminals of a row, batch or rollout sample (or a list).

    Rows: lengths, one line per image (grid, tokens, resized size, token range, position
    ranges) and the token sequence (decoded with ``tokenizer``, else ids; long text runs
    collapsed beyond ``max_tokens``; trained tokens between ⟦ ⟧). Batches: a per-row table
    (length, padding, images, tokens per image, grids, labels), then each row.
    """
    toks = TokenText(tokenizer)
    if isinstance(obj, (list, tuple)):
        return "\n".join(describe(o, tokenizer=tokenizer, max_tokens=max_tokens) for o in obj)
    if as_tiled(obj) is not None:  # a tiled family's row or batch: tiles, no grids (mmpipe.view.tiled)
        return describe_tiled(obj, tokenizer=tokenizer, max_tokens=max_tokens)
    if isinstance(obj, BatchedMultiModalInputs):
        info = batch_table_rows(obj)
        B, L = obj.input_ids.shape
        n_vid = sum(len(r["videos"]) for r in info)
        lines = [f"BatchedMultiModalInputs: {obj.family}, B={B} rows x L={L}, {sum(len(r['images']) for r in info)} "
                 f"images{f', {n_vid} videos' if n_vid else ''}, padding {obj.padding_side}, pixels {obj.pixel_format}"]
        head = ("row", "length", "padding", "images", "tokens/image", "grids", "labels")
        table = [head]
        for r in info:
            table.append((
                str(r["row"]), str(r["length"]), str(r["padding"]),
                f"{len(r['images'])} {r['images']}" + (f" +videos {r['videos']}" if r["videos"] else ""),
                ",".join(map(str, r["tokens_per_image"])) or "-",
                ",".join(grid_str(g) for g in r["grids"]) or "-",
                f"yes ({r['trained_tokens']} trained)" if r["has_labels"] else "no",
            ))
        widths = [max(len(t[c]) for t in table) for c in range(len(head))]
        for t in table:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
        for b, row in enumerate(unbatch(obj)):
            lines += _describe_row(row, toks, max_tokens, info[b]["images"], info[b]["videos"], f"row {b}", "  ")
        return "\n".join(lines)
    if isinstance(obj, RolloutSample):
        lp = None if obj.logprobs is None else np.asarray(obj.logprobs, np.float64)
        R = len(obj.response_ids)
        stats = f", logprobs mean {lp.mean():.4f} min {lp.min():.4f}" if (lp is not None and R) else ""
        lines = [f"RolloutSample: prompt {obj.prompt_index} sample {obj.sample_index}, finish {obj.finish_reason}"
                 + (f" ({obj.stop_reason})" if obj.stop_reason is not None else "")
                 + f", {obj.prompt.num_tokens} prompt + {R} response tokens{stats}"]
        lines += _describe_row(obj.to_row(), toks, max_tokens, title="prompt+response", indent="  ")
        return "\n".join(lines)
    return "\n".join(_describe_row(as_row(obj), toks, max_tokens))
