"""cosmos-rl style data packers built on mmpipe's stages.

cosmos-rl's ``DataPacker`` interface (``get_rollout_input``, ``rollout_collate_fn``,
``get_policy_input``, ``policy_compute_max_len``, ``policy_collate_fn``), implemented for
decoder-only LLMs (an item is a string or a chat list) and the Qwen-VL families (chat
content lists with ``{"type": "image", "image": ...}`` items). Unlike cosmos-rl's VL packer,
the image processor runs once per image (the rollout input *is* the encoded prompt, and
``get_policy_input`` reuses it), and a batch may mix rows with and without images.

    packer = QwenVLDataPacker(processor)
    prompts = packer.rollout_collate_fn([packer.get_rollout_input(it) for it in items])
    gens = engine.generate(prompts, SamplingParams(n=4, temperature=1.0))
    policy = [packer.get_policy_input(p, c) for p, g in zip(prompts, gens) for c in g.completions]
    batch = packer.policy_collate_fn(policy, packer.policy_compute_max_len(policy))
    out = model(**{k: batch[k] for k in packer.model_keys(batch)})
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from mmpipe.batching.collate import collate
from mmpipe.encoding.encoder import Encoder
from mmpipe.encoding.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError
from mmpipe.records.generation import Completion
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.rollout import RolloutSample


class DataPacker:
    """Dataset items -> rollout inputs -> policy inputs -> a policy batch.

    Args:
        processor: a Qwen-VL processor, or a tokenizer for a decoder-only LLM.
        padding_side: of the policy batch (``"right"``, cosmos-rl's convention).
        on_vision_token: what `get_policy_input` does with a vision special token in a response:
            ``"raise"`` (a `PlaceholderError` naming the position and token) or ``"mask"``
            (the pad id with label -100; see `mmpipe.encoding.vision_tokens`).
        encode_options: passed to `Encoder` (``max_length``, ``truncation``, ``pixels``...).
    """

    def __init__(self, processor, *, padding_side: str = "right", on_vision_token: str = "raise", **encode_options):
        encode_options.setdefault("labels", False)
        self.encoder = Encoder(processor, **encode_options)
        self.processor = processor
        self.tokenizer = self.encoder.tokenizer
        self.vision_tokens = VisionTokens.from_processor(self.tokenizer, family=self.encoder.family,
                                                         policy=on_vision_token)
        self.padding_side = padding_side
        self._cache: dict[int, tuple[Any, MultiModalInputs]] = {}

    # ---- dataset -> rollout ------------------------------------------------------------
    def to_row(self, item: Any) -> dict:
        """A dataset item as a raw row for `mmpipe.encode`."""
        if isinstance(item, str):
            return {"messages": [{"role": "user", "content": item}]}
        if isinstance(item, (list, tuple)):
            return {"messages": list(item)}
        if isinstance(item, dict):
            return item
        raise TypeError(f"unsupported dataset item of type {type(item).__name__}; expected str, chat list or row dict")

    def get_rollout_input(self, item: Any) -> MultiModalInputs:
        """The encoded prompt (generation prompt added): what a rollout engine takes.

        For vLLM, turn these into prompts with ``mmpipe.rollout.inputs.to_vllm_prompts``."""
        cached = self._cache.get(id(item))
        if cached is not None and cached[0] is item:
            return cached[1]
        row = self.encoder.encode_row(self.to_row(item))
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[id(item)] = (item, row)
        return row

    def rollout_collate_fn(self, items: Sequence[MultiModalInputs]) -> list[MultiModalInputs]:
        """Rollout inputs -> what the engine takes: the encoded prompt rows as a list."""
        return list(items)

    # ---- rollout -> policy -------------------------------------------------------------
    def get_policy_input(
        self,
        sample: Any,
        rollout_output: Union[str, Sequence[int], Completion, RolloutSample],
        n_ignore_prefix_tokens: int = 0,
    ) -> MultiModalInputs:
        """Prompt + response as a training row; labels on the response tokens only.

        ``sample``: the rollout input (no re-encoding) or the dataset item (encoded once and
        cached by identity). ``rollout_output``: the generated ids (preferred: no
        re-tokenization drift), a `Completion` / `RolloutSample`, or the completion text.
        ``n_ignore_prefix_tokens`` response tokens at the start get no loss (cosmos-rl).
        A vision special token in the response is refused or masked (``on_vision_token``).
        """
        prompt = sample if isinstance(sample, MultiModalInputs) else self.get_rollout_input(sample)
        if isinstance(rollout_output, RolloutSample):
            ids = rollout_output.response_ids
        elif isinstance(rollout_output, Completion):
            ids = rollout_output.token_ids
        elif isinstance(rollout_output, str):
            ids = self.tokenizer(rollout_output, add_special_tokens=False)["input_ids"]
        else:
            ids = rollout_output
        ids = np.asarray(ids, dtype=np.int64)
        at = (rollout_output.prompt_index, rollout_output.sample_index) if isinstance(rollout_output, RolloutSample) else (0, 0)
        row = RolloutSample(prompt, *at, ids, None, "stop").to_row(self.vision_tokens)
        if n_ignore_prefix_tokens:
            start = prompt.num_tokens
            row.labels[start:start + n_ignore_prefix_tokens] = IGNORE_INDEX
        return row

    def policy_compute_max_len(self, processed_samples: Sequence[MultiModalInputs]) -> int:
        """Length to pad the policy batch to: the longest policy row's token count."""
        return max(r.num_tokens for r in processed_samples)

    def policy_collate_fn(self, processed_samples: Sequence[MultiModalInputs], computed_max_len: int) -> dict[str, Any]:
        """The policy batch: input_ids / attention_mask / labels int64 [B, L], position_ids
        int64 [3, B, L] (text models: [B, L]), pixel data and grids when any row has images,
        ``logprob_masks`` bool [B, L] (True where the token is a trained response token), and
        ``batch``: the `BatchedMultiModalInputs` itself."""
        batch = collate(
            processed_samples, processor=self.processor, padding_side=self.padding_side, pad_to_length=computed_max_len
        )
        out = batch.model_inputs(labels=False)
        out["labels"] = batch.labels
        out["logprob_masks"] = batch.labels != IGNORE_INDEX
        out["batch"] = batch
        return out

    @staticmethod
    def model_keys(policy_batch: dict) -> list[str]:
        """Keys of a policy batch that the model's forward takes."""
        return [k for k in policy_batch if k not in ("labels", "logprob_masks", "batch")]


class DecoderOnlyLLMDataPacker(DataPacker):
    """Items are prompt strings or chat lists; the processor is a tokenizer."""


class QwenVLDataPacker(DataPacker):
    """Items are chat lists whose content lists carry ``{"type": "image", "image": ...}``
    items (or Hub-style rows with an ``images`` column)."""

    def __init__(self, processor, **kw):
        super().__init__(processor, **kw)
        if not self.encoder.family.is_vision:
            raise ArgumentError(
                f"QwenVLDataPacker needs a Qwen-VL processor (one of the vision families), got a "
                f"{self.encoder.family.name!r} one; use DecoderOnlyLLMDataPacker for text models"
            )
