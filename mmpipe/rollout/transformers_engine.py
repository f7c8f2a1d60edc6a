"""Rollout engines over a transformers model (this module) and vLLM (`vllm_engine`).

Both take encoded prompt rows and return engine-neutral `Generation` s; the model always
receives the rows' images (``pixel_values`` + ``image_grid_thw`` + ``mm_token_type_ids``),
which is the failure this layer exists to prevent: an agent loop that calls generation with
only ``input_ids`` / ``attention_mask`` makes the model answer without ever seeing the image.

    engine = TransformersEngine(model, processor)
    gens = engine.generate(rows, SamplingParams(max_new_tokens=64, n=4, temperature=1.0, seed=0))
"""

from __future__ import annotations

from typing import Sequence

from mmpipe.batching.collate import Collator
from mmpipe.compat import is_transformers_5
from mmpipe.encoding.vision_tokens import VisionTokens
from mmpipe.records.generation import Generation, SamplingParams
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.inputs import to_generate_kwargs
from mmpipe.rollout.sampling import sample
from mmpipe.rollout.tiled_generate import check_tiled_engine, tiled_generate


class TransformersEngine:
    """`RolloutEngine` over a transformers ``GenerationMixin`` model (CPU or GPU).

    Prompts are left-padded and turned into ``generate`` kwargs by
    `mmpipe.rollout.inputs.to_generate_kwargs` (which refuses a batch whose images have no
    pixel data); ``generate`` builds the 3-D positions and rope deltas itself from
    ``mm_token_type_ids`` and the grids. ``n > 1`` repeats each prompt ``n`` times in the
    generation batch (prompt-major), so greedy and sampled groups work alike.

    Logprobs are those of the sampled token under the model's raw logits (log_softmax of the
    logits before temperature / top-p processing): what teacher forcing over the same tokens
    computes, so rollout and training logprobs are comparable.

    Vision special tokens are banned at sampling unless ``params.allow_vision_tokens``:
    ``generate(suppress_tokens=...)`` (transformers' ``SuppressTokensLogitsProcessor``, -inf on
    those ids) with the family's ids in this tokenizer (`VisionTokens`, ``self.vision_tokens``).
    The processor works on a copy of the logits, so the reported logprobs are still the raw
    ones above (the unconstrained model's, as teacher forcing computes them).

    A tiled family's processor (Gemma 3, InternVL, LLaVA-OneVision) generates through
    `mmpipe.rollout.tiled_generate.tiled_generate` (prompt `MultiModalInputs`, 1-D positions, the
    family's image and feature tokens banned); `teacher_forced_logprobs` takes its `BatchedMultiModalInputs`.
    """

    def __init__(self, model, processor, *, see_images: bool = True):
        self.model = model
        self.processor = processor
        self.collator = Collator(processor, padding_side="left")
        tok = getattr(processor, "tokenizer", processor)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = tok.eos_token_id
        self.eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_ids[0]
        # a tiled family (Gemma 3, InternVL, LLaVA-OneVision): mmpipe.rollout.tiled_generate
        self.tiled_family = check_tiled_engine(processor)
        self.vision_tokens = None if self.tiled_family else VisionTokens.from_processor(processor)
        # see_images=False exists for tests that prove the model really uses the images
        self.see_images = see_images

    def generate(self, rows: Sequence, params: SamplingParams = SamplingParams()) -> list[Generation]:
        """rows: prompt `MultiModalInputs` or stored dicts; returns one `Generation` per row, in
        order, each with ``params.n`` completions (generated ids up to and including the first
        stop token; per-token logprobs float when ``params.logprobs``)."""
        if self.tiled_family is not None:
            return tiled_generate(self.model, self.processor, self.collator, rows, params, eos_ids=self.eos_ids,
                                  pad_id=self.pad_id, see_images=self.see_images)
        recs = [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(rows)]
        expanded = [r for r in recs for _ in range(params.n)]
        batch = self.collator(expanded)
        device = next(self.model.parameters()).device
        # videos: pass mmpipe's positions (the original Qwen rule, what training and vLLM use);
        # transformers 5's own get_rope_index differs for clips longer than max(h, w)/merge
        videos = bool(batch.video_grid_thw.shape[0]) and is_transformers_5()
        kw = to_generate_kwargs(batch, device, model=self.model, position_ids=videos)
        if not self.see_images:
            for k in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
                kw.pop(k, None)
        stop = tuple(self.eos_ids) + tuple(params.stop_token_ids)
        suppress = [] if params.allow_vision_tokens else list(self.vision_tokens.ids)
        return sample(self.model, kw, params, stop=stop, pad_id=self.pad_id, suppress=suppress, num_prompts=len(recs))


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
