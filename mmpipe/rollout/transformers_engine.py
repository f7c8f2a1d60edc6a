"""Rollout engines over a transformers model (this module) and vLLM (`vllm_engine`).

Both take encoded prompt rows and return engine-neutral `Generation` s; the model always
receives the rows' images (``pixel_values`` + ``image_grid_thw`` + ``mm_token_type_ids``),
which is the failure this layer exists to prevent: an agent loop that calls generation with
only ``input_ids`` / ``attention_mask`` makes the model answer without ever seeing the image.

    engine = TransformersEngine(model, processor)
    gens = engine.generate(rows, SamplingParams(max_new_tokens=64, n=4, temperature=1.0, seed=0))
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np

from mmpipe.batching.collate import Collator
from mmpipe.compat import is_transformers_5
from mmpipe.errors import PixelDataError
from mmpipe.records.generation import Generation, SamplingParams
from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.rollout.inputs import prompt_rows, to_generate_kwargs
from mmpipe.rollout.sampling import check_params, sample
from mmpipe.rollout.support import check_processor
from mmpipe.rollout.tf4_positions import needs_training_positions, training_positions

__all__ = ["TransformersEngine", "teacher_forced_logprobs", "response_logprobs", "banned_tokens"]


class TransformersEngine:
    """`RolloutEngine` over a transformers ``GenerationMixin`` model (CPU or GPU), for every
    family that rolls out and the generic path (`mmpipe.rollout.support`; its models build their own
    positions, e.g. the Omni thinkers' TMRoPE, and the media tokens its processor names are banned).

    Prompts are left-padded and turned into ``generate`` kwargs by
    `mmpipe.rollout.inputs.to_generate_kwargs` (which refuses a batch whose images have no
    pixel data); ``generate`` builds the positions itself (the 3-D positions and rope deltas
    of the M-RoPE families from ``mm_token_type_ids`` and the grids; ``0..n-1`` from the
    attention mask for the 1-D ones: Gemma 3, InternVL, LLaVA-OneVision, as training numbers
    them). The model gets the rows' images through `BatchedMultiModalInputs.model_inputs`
    (``pixel_values`` + ``image_grid_thw``; the tiles and the family's extras, e.g. Gemma 3's
    ``token_type_ids``, LLaVA-OneVision's ``image_sizes``); on transformers 4.x a Qwen2.5-VL video
    batch is numbered by mmpipe's rule (`mmpipe.rollout.tf4_positions`: 4.57's truncates
    ``second_per_grid_ts``). ``n > 1`` repeats each prompt ``n``
    times in the generation batch (prompt-major), so greedy and sampled groups work alike.

    Logprobs are those of the sampled token under the model's raw logits (log_softmax of the
    logits before temperature / top-p processing): what teacher forcing over the same tokens
    computes, so rollout and training logprobs are comparable.

    Vision special tokens are banned at sampling unless ``params.allow_vision_tokens``:
    ``generate(suppress_tokens=...)`` (transformers' ``SuppressTokensLogitsProcessor``, -inf on
    those ids) with the family's ids in this tokenizer (`VisionTokens`, ``self.vision_tokens``:
    the pads and block borders of the patch grids, the image and feature tokens of the tiles, the
    image / video / audio tokens and their borders a generic-path processor names).
    The processor works on a copy of the logits, so the reported logprobs are still the raw
    ones above (the unconstrained model's, as teacher forcing computes them).
    """

    def __init__(self, model, processor, *, see_images: bool = True):
        self.model = model
        self.processor = processor
        self.family = check_processor(processor, "generate")
        self.collator = Collator(processor, padding_side="left")
        tok = getattr(processor, "tokenizer", processor)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = tok.eos_token_id
        self.eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_ids[0]
        self.vision_tokens = VisionTokens.from_processor(processor, family=self.family)
        # see_images=False exists for tests that prove the model really uses the images
        self.see_images = see_images

    def generate(self, rows: Sequence, params: SamplingParams = SamplingParams()) -> list[Generation]:
        """rows: prompt `MultiModalInputs` or stored dicts; returns one `Generation` per row, in
        order, each with ``params.n`` completions (generated ids up to and including the first
        stop token; per-token logprobs float when ``params.logprobs``)."""
        check_params(params)
        recs = prompt_rows(rows)
        if not recs:
            return []
        blind = [i for i, r in enumerate(recs) if r.num_images and not r.has_pixels]
        if blind and self.see_images:  # the failure this layer exists to prevent: answering without the images
            raise PixelDataError("a prompt row holds images but no pixels (layout-only, pixels='none'): the "
                                 "model would answer without seeing them", row=blind[0], column="pixel_values_u8",
                                 stage="rollout", expected=f"pixels for {recs[blind[0]].num_images} image(s)",
                                 found="no pixel data", fix="encode rollout prompts with pixels='uint8' (or 'source')")
        batch = self.collator([r for r in recs for _ in range(params.n)])
        device = next(self.model.parameters()).device
        # videos: pass mmpipe's positions (the original Qwen rule, what training and vLLM use);
        # transformers 5's own get_rope_index differs for clips longer than max(h, w)/merge
        videos = bool(batch.video_grid_thw.shape[0]) and is_transformers_5()
        stop = tuple(self.eos_ids) + tuple(params.stop_token_ids)
        suppress = [] if params.allow_vision_tokens else list(self.vision_tokens.ids)
        # transformers 4.x numbers the prompt itself; its Qwen2.5-VL rule truncates second_per_grid_ts
        own = needs_training_positions(self.family, batch)
        tok = getattr(self.processor, "tokenizer", self.processor)
        with training_positions(self.model, self.family, tok) if own else contextlib.nullcontext():
            kw = to_generate_kwargs(batch, device, model=self.model, position_ids=videos)
            if not self.see_images:  # the family's media inputs withheld; ids, mask, token types stay
                for k in batch.vision_inputs():
                    kw.pop(k, None)
            return sample(self.model, kw, params, stop=stop, pad_id=self.pad_id, suppress=suppress,
                          num_prompts=len(recs))


def banned_tokens(processor) -> list[int]:
    """The ids sampling bans for ``processor`` unless ``allow_vision_tokens`` (its family's
    vision tokens, `VisionTokens.from_processor`), sorted."""
    return sorted(VisionTokens.from_processor(processor).ids)


def teacher_forced_logprobs(model, batch, device=None) -> "object":
    """float32 [B, L]: log p(token t | tokens < t) under ``model`` for every position of a
    collated batch (position 0 and pads are 0). The training-side half of the
    rollout/training consistency check."""
    import torch

    kw = batch.model_inputs(device if device is not None else next(model.parameters()).device, labels=False)
    # (a BatchedMultiModalInputs gives 1-D position_ids [B, L], its token types and pixels likewise)
    with torch.no_grad():
        logits = model(**kw).logits.float()
    ids = kw["input_ids"]
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    out = torch.zeros(ids.shape, dtype=torch.float32, device=lp.device)
    out[:, 1:] = lp * kw["attention_mask"][:, 1:]
    return out


def response_logprobs(teacher: np.ndarray, rows: Sequence, lengths: Sequence[int],
                      padding_side: str = "right") -> list[np.ndarray]:
    """The response part of `teacher_forced_logprobs` [B, L] (numpy) of training rows whose last
    ``lengths[b]`` tokens are the response (`RolloutSample.to_row`): float32 [R] per row."""
    teacher = np.asarray(teacher)
    out = []
    for b, (r, n) in enumerate(zip(rows, lengths)):
        start = 0 if padding_side == "right" else teacher.shape[1] - len(r)
        out.append(teacher[b, start + len(r) - n:start + len(r)].astype(np.float32))
    return out
