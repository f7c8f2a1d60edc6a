"""Rollouts on a tiled family's rows (Gemma 3, InternVL, LLaVA-OneVision) with a transformers
model: prompt rows -> ``model.generate`` -> `Generation` s -> training rows.

`mmpipe.rollout.transformers_engine.TransformersEngine` comes here by itself for a tiled
family's processor::

    engine = TransformersEngine(model, processor)          # a Gemma3Processor, InternVLProcessor ...
    gens = engine.generate(prompt_rows, SamplingParams(max_new_tokens=64, n=4, temperature=1.0))
    rows = tiled_rollout_rows(prompt_rows, gens, processor)  # MultiModalInputs: prompt + response, labels
    batch = mmpipe.Collator(processor, padding_side="right")(rows)
    lp = teacher_forced_logprobs(model, batch)              # == the sampled tokens' logprobs

The model gets the rows' images (``pixel_values`` [N, 3, S, S] from the stored tiles, Gemma 3's
``token_type_ids``, LLaVA-OneVision's ``image_sizes``) through `BatchedMultiModalInputs.model_inputs`, with
no ``position_ids``: ``generate`` numbers a left-padded row's tokens from its attention mask,
``0..n-1`` as training does. Sampling bans the family's image and feature tokens (the model
would otherwise emit them at temperature 1.0 and break the image-token count of the row fed
back). Logprobs are those of the sampled token under the raw logits (before temperature /
top-p), what teacher forcing computes. `mmpipe.rollout.results.unbatch_rollout` and the
multi-turn `Conversation` are Qwen-VL records; tiled rows use `tiled_rollout_rows`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import tiled_family_of
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.generation import Generation, SamplingParams
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.sampling import sample

__all__ = ["banned_tokens", "tiled_generate", "tiled_rollout_rows"]


def banned_tokens(processor) -> list[int]:
    """Ids sampling must not emit for a tiled family's processor: its ``image_token`` (what the
    chat template renders per image) and ``feature_token`` (what the model fills with image
    features), each once."""
    ids = tiled_family_of(processor).token_ids(processor.tokenizer)
    return sorted({int(i) for i in ids.values() if i is not None and i >= 0})


def _rows(rows: Sequence) -> list[MultiModalInputs]:
    return [r if isinstance(r, MultiModalInputs) else MultiModalInputs.from_dict(r, i) for i, r in enumerate(rows)]


def tiled_generate(model, processor, collator, rows: Sequence, params: SamplingParams, *, eos_ids: tuple,
                   pad_id: int, see_images: bool = True) -> list[Generation]:
    """`TransformersEngine.generate` for tiled rows (module doc): ``rows`` prompt `MultiModalInputs`
    or stored dicts; one `Generation` per row with ``params.n`` completions (ids up to and
    including the first stop token; float logprobs when ``params.logprobs``)."""
    recs = _rows(rows)
    blind = [i for i, r in enumerate(recs) if r.num_images and not r.has_pixels]
    if blind and see_images:  # the failure this layer exists to prevent: answering without the images
        raise InputError("a prompt row holds images but no pixels (layout-only, pixels='none'): the model would "
                         "answer without seeing them", row=blind[0], column="pixel_values_u8", stage="rollout",
                         fix="encode rollout prompts with pixels='uint8' (or 'source')")
    batch = collator([r for r in recs for _ in range(params.n)])
    device = next(model.parameters()).device
    kw = batch.model_inputs(device, positions="none", labels=False)
    if not see_images:  # tests: prove the model uses the images
        kw = {k: v for k, v in kw.items() if k in ("input_ids", "attention_mask")}
    stop = tuple(eos_ids) + tuple(params.stop_token_ids)
    suppress = [] if params.allow_vision_tokens else banned_tokens(processor)
    return sample(model, kw, params, stop=stop, pad_id=pad_id, suppress=suppress, num_prompts=len(recs))


def tiled_rollout_rows(prompts: Sequence, generations: Sequence[Generation], processor=None) -> list[MultiModalInputs]:
    """Prompt rows + their `Generation` s -> one training row per completion, prompt-major:
    the prompt's tokens and images, then the response (``mm_token_type_ids`` 0, labels on the
    response only). With ``processor``, a response holding the family's image or feature token
    raises `InputError` naming prompt, sample and position (it would break the row's
    image-token count)."""
    recs = _rows(prompts)
    if len(generations) != len(recs) or any(g.prompt_index != i for i, g in enumerate(generations)):
        raise ArgumentError(f"tiled_rollout_rows takes one Generation per prompt, in prompt order "
                            f"({len(recs)} prompts, {len(generations)} generations)")
    banned = np.asarray(banned_tokens(processor) if processor is not None else [], np.int64)
    out = []
    for i, (r, g) in enumerate(zip(recs, generations)):
        for j, c in enumerate(g.completions):
            resp = np.asarray(c.token_ids, np.int64)
            bad = np.flatnonzero(np.isin(resp, banned))
            if len(bad):
                raise InputError(f"prompt {i} sample {j}: the response holds image token id {int(resp[bad[0]])} at "
                                 f"response position {int(bad[0])}", row=i, column="response_ids", stage="rollout",
                                 fix="sample with allow_vision_tokens=False (the default bans them)")
            zeros = np.zeros(len(resp), np.int64)
            prompt_labels = np.full(len(r), IGNORE_INDEX, np.int64)
            out.append(MultiModalInputs(family=r.family, input_ids=np.concatenate([r.input_ids, resp]),
                                   attention_mask=np.ones(len(r) + len(resp), np.int64),
                                   mm_token_type_ids=np.concatenate([r.mm_token_type_ids, zeros]),
                                   image_hw=r.image_hw, tiles_per_image=r.tiles_per_image,
                                   pixel_values_u8=r.pixel_values_u8,
                                   labels=np.concatenate([prompt_labels, resp])).validate(i))
    return out


def response_logprobs(teacher: np.ndarray, rows: Sequence[MultiModalInputs], lengths: Sequence[int],
                      padding_side: str = "right") -> list[np.ndarray]:
    """The response part of `teacher_forced_logprobs` [B, L] for rows from `tiled_rollout_rows`
    (``lengths``: each row's response length): float32 [R] per row."""
    teacher = np.asarray(teacher)
    out = []
    for b, (r, n) in enumerate(zip(rows, lengths)):
        start = 0 if padding_side == "right" else teacher.shape[1] - len(r)
        out.append(teacher[b, start + len(r) - n:start + len(r)].astype(np.float32))
    return out


def check_tiled_engine(processor) -> Optional[str]:
    """The tiled family's name for ``processor`` (`TransformersEngine` then generates through
    `tiled_generate`), else None."""
    fam = tiled_family_of(processor)
    return None if fam is None else fam.name
