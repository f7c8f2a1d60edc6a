"""cosmos-rl data packers built on mmpipe's stages.

The whole interface cosmos-rl 0.4.7 calls on a packer (``BaseDataPacker``): ``setup(config)``,
``get_rollout_input``, ``rollout_collate_fn``, ``get_rollout_output``, ``get_policy_input``,
``policy_compute_max_len``, ``policy_collate_fn``, ``sft_process_sample``,
``sft_compute_max_len``, ``sft_collate_fn``, ``extend_conversation``, ``batch_size``,
``slice_batch``, ``save_state``, ``pad_token_id``; for decoder-only LLMs (an item is a string
or a chat list) and the Qwen-VL families (chat content lists with ``{"type": "image",
"image": ...}`` items). Unlike cosmos-rl's VL packer the image processor runs once per image
per process and a batch may mix rows with and without images.

With cosmos-rl installed the public classes subclass its ``BaseDataPacker`` (what
``comm/base.py``'s ``init_data_packer`` checks), resolved on first use (`packer_class`;
nothing imports cosmos-rl before); without it they are standalone classes with the same
methods. Built the way cosmos-rl builds packers: no arguments, then ``setup(config)`` loads
the processor from ``config.policy.model_name_or_path`` (`mmpipe.processors.load_processor`)::

    from mmpipe.families import QWEN2_5_VL
    from mmpipe.rollout.packers import QwenVLDataPacker, register_with_cosmos
    register_with_cosmos(QwenVLDataPacker, QWEN2_5_VL.model_types)   # get_default_data_packer -> ours

What cosmos-rl receives:
- ``get_rollout_input(item)``: a vLLM prompt in the form cosmos-rl's vLLM rollout consumes:
  ``{"prompt_token_ids": [...] (one <|image_pad|> per image), "multi_modal_data": {"image":
  [base64 PNG str, ...]}, "mm_processor_kwargs": {...}}`` (``decode_vision_info`` turns the
  strings into PIL images; the PNGs are the stored resized images, lossless).
- ``get_policy_input`` / ``sft_process_sample``: a `CosmosRow` (`mmpipe.records.cosmos`), the
  encoded row that cosmos-rl's trainers also read per sample (``sample.logprob_masks``,
  assignable: distillation with ``include_prompt`` replaces it, and the collate follows).
- ``policy_collate_fn``: ``input_ids`` / ``attention_mask`` int64 [B, L], ``position_ids``
  int64 [3, B, L], pixel data and grids, and ``logprob_masks`` bool [B, L] at LOGIT positions:
  True at t when the logits at t predict a response token (``compute_logprobs`` scores
  ``input_ids[:, t + 1]`` there), i.e. the label mask shifted left by one.
"""

from __future__ import annotations

import base64
import io
from dataclasses import replace
from typing import Any, Optional, Sequence, Union

import numpy as np

from mmpipe.batching.collate import collate
from mmpipe.encoding.encoder import Encoder
from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.generation import Completion
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.rollout import RolloutSample
from mmpipe.records.cosmos import CosmosRow
from mmpipe.rollout.cosmos_side import (  # noqa: F401  (register_with_cosmos: public here too)
    PromptCache, built_once, check_fits, check_prompt, completed_conversation, cosmos_base_packer, encoded_sft_row,
    refuse_skips,
    register_with_cosmos, stored_item,
)

__all__ = ["DataPacker", "DecoderOnlyLLMDataPacker", "QwenVLDataPacker", "CosmosRow", "packer_class",
           "cosmos_base_packer", "register_with_cosmos", "shift_to_logit_positions"]


def shift_to_logit_positions(label_mask):
    """Label mask bool [B, L] (True where the token is a target) -> the mask at logit positions
    (True at t when the logits at t predict a target token): shifted left by one, last False."""
    import torch

    out = torch.zeros_like(label_mask, dtype=torch.bool)
    out[:, :-1] = label_mask[:, 1:]
    return out


class DataPackerCore:
    """Dataset items -> rollout inputs -> policy inputs -> a policy batch (see the module doc).

    Args (all optional: cosmos-rl builds packers with no arguments and calls ``setup``):
        processor: a Qwen-VL processor, or a tokenizer for a decoder-only LLM.
        padding_side: of the policy batch (``"right"``, cosmos-rl's convention).
        on_vision_token: what `get_policy_input` does with a vision special token in a response:
            ``"raise"`` (a `PlaceholderError` naming the position and token) or ``"mask"``
            (the pad id with label -100; see `mmpipe.records.vision_tokens`).
        tool_agent: cosmos-rl's multi-turn tool agent (kept as ``self.tool_agent``).
        encode_options: passed to `Encoder` (``max_length``, ``pixels``...; not the options that
            leave an item out: `refuse_skips`). An item may be an encoded row (a record or a stored
            dict; a failed one is refused: `stored_item`, `check_prompt`).
    """

    def __init__(self, processor=None, *, padding_side: str = "right", on_vision_token: str = "raise",
                 tool_agent=None, **encode_options):
        self.tool_agent = tool_agent
        self.padding_side = padding_side
        self.on_vision_token = on_vision_token
        self.encode_options = dict(encode_options)
        self.processor = None
        self._cache = PromptCache()
        if processor is not None:
            self.bind(processor)

    # ---- construction --------------------------------------------------------------------
    def bind(self, processor) -> None:
        """Use ``processor`` (what ``setup`` does with the one it loads)."""
        opts = dict(self.encode_options)
        refuse_skips(self, opts)
        opts.setdefault("labels", False)
        self.encoder = Encoder(processor, **opts)
        self.sft_encoder = Encoder(processor, **dict(opts, labels=True))
        self.processor = processor
        self.tokenizer = self.encoder.tokenizer
        self.vision_tokens = VisionTokens.from_processor(self.tokenizer, family=self.encoder.family,
                                                         policy=self.on_vision_token)
        self._cache.clear()
        self._check_family()

    def _check_family(self) -> None:
        """Subclasses refuse processors of the wrong kind."""

    def setup(self, config, *args, **kwargs) -> None:
        """cosmos-rl's hook after construction: keeps ``config`` and loads the processor of
        ``config.policy.model_name_or_path`` (a directory, or ``testing:FAMILY``) unless one
        was given; drops the tool agent when multi-turn rollouts are off (as cosmos-rl's)."""
        if config is None:
            raise ArgumentError("setup(config): config is None; cosmos-rl passes its Config here")
        self.config = config
        if self.processor is None:
            from mmpipe.processors import load_processor

            self.bind(load_processor(config.policy.model_name_or_path))
        multi_turn = getattr(getattr(getattr(config, "rollout", None), "multi_turn_config", None), "enable", False)
        if not multi_turn:
            self.tool_agent = None

    def _need_processor(self) -> None:
        if self.processor is None:
            raise ArgumentError(
                f"{type(self).__name__} has no processor: pass one (QwenVLDataPacker(processor)) or call "
                "setup(config) first, as cosmos-rl does after building the packer"
            )

    @property
    def pad_token_id(self) -> int:
        self._need_processor()
        return self.tokenizer.pad_token_id

    def save_state(self, dest_path: str) -> None:
        """Save the processor (or tokenizer) next to a checkpoint."""
        if self.processor is not None:
            self.processor.save_pretrained(dest_path)

    # ---- dataset -> rollout --------------------------------------------------------------
    def to_row(self, item: Any) -> dict:
        """A dataset item as a raw row for `mmpipe.encode`."""
        if isinstance(item, str):
            return {"messages": [{"role": "user", "content": item}]}
        if isinstance(item, (list, tuple)):
            return {"messages": [m.model_dump() if hasattr(m, "model_dump") else m for m in item]}
        if isinstance(item, dict):
            return item
        raise TypeError(f"unsupported dataset item of type {type(item).__name__}; expected str, chat list or row dict")

    def encode_prompt(self, item: Any) -> MultiModalInputs:
        """The encoded prompt of a dataset item (generation prompt added), cached by identity:
        what local engines (`TransformersEngine`) take and what `get_policy_input` extends."""
        if isinstance(item, MultiModalInputs):
            return check_prompt(item, "encode_prompt")
        self._need_processor()
        cached = self._cache.get(item)
        if cached is not None:
            return cached
        row = stored_item(item, "encode_prompt")
        row = self.encoder.encode_row(self.to_row(item)) if row is None else check_prompt(row, "encode_prompt")
        self._cache.put(item, row)
        return row

    def get_rollout_input(self, item: Any) -> dict:
        """The vLLM prompt of a dataset item in cosmos-rl's rollout form (see the module doc)."""
        from mmpipe.rollout.inputs import to_vllm_prompts

        prompt = to_vllm_prompts([self.encode_prompt(item)], self.processor)[0]
        mm = prompt.get("multi_modal_data")
        if mm:
            prompt["multi_modal_data"] = {"image": [_png_base64(im) for im in mm["image"]]}
        return prompt

    def rollout_collate_fn(self, items: Sequence[Any]) -> list:
        """Rollout inputs -> what the engine takes: the list itself."""
        return list(items)

    def get_rollout_output(self, completions: list, completed_conversations: list, logprobs: list,
                           token_ids: list, **kwargs) -> tuple:
        """Post-processing of rollout outputs (cosmos-rl's default): returned unchanged."""
        return completions, completed_conversations, logprobs, token_ids, kwargs

    def extend_conversation(self, conversation: list, responses: list[str], ground_truth: Optional[str] = None) -> list:
        """Multi-turn: the conversation with the first response as an assistant message
        (cosmos-rl's own method when installed: it appends a ``ChatMessage`` in place)."""
        base = getattr(super(), "extend_conversation", None)
        if base is not None:
            return base(conversation, responses, ground_truth)
        return list(conversation) + [{"role": "assistant", "content": responses[0] if responses else ""}]

    # ---- rollout -> policy ---------------------------------------------------------------
    def get_policy_input(
        self,
        sample: Any,
        rollout_output: Union[str, Sequence[int], Completion, RolloutSample],
        n_ignore_prefix_tokens: int = 0,
    ) -> CosmosRow:
        """Prompt + response as a training row (a `CosmosRow`: the row, also readable as
        cosmos-rl's per-sample record); labels on the response tokens only.

        ``sample``: the dataset item (as cosmos-rl passes it; encoded once and cached by
        identity) or an encoded prompt row. ``rollout_output``: the generated ids (preferred:
        no re-tokenization drift), a `Completion` / `RolloutSample`, or the completion text.
        The first ``n_ignore_prefix_tokens`` response tokens get no loss (cosmos-rl). A vision
        special token in the response is refused or masked (``on_vision_token``).
        """
        from mmpipe.rollout.support import token_ids

        if isinstance(n_ignore_prefix_tokens, bool) or not isinstance(n_ignore_prefix_tokens, (int, np.integer)) \
                or n_ignore_prefix_tokens < 0:
            raise ArgumentError(f"get_policy_input: n_ignore_prefix_tokens must be an int >= 0 (response tokens "
                                f"without loss), got {n_ignore_prefix_tokens!r}")
        completed = completed_conversation(self, sample)
        prompt = self.sft_encoder.encode_row({"messages": completed[:-1]}) if completed else self.encode_prompt(sample)
        if isinstance(rollout_output, RolloutSample):
            ids = rollout_output.response_ids
        elif isinstance(rollout_output, Completion):
            ids = rollout_output.token_ids
        elif isinstance(rollout_output, str):
            ids = self.tokenizer(rollout_output, add_special_tokens=False)["input_ids"]
        else:
            ids = rollout_output
        # floats (int64 would floor them), -1 fills, None, nested lists: refused here, by name, not
        # by the model's embedding deep in the trainer step
        ids = token_ids(ids, where="get_policy_input(sample, rollout_output)", row=None,
                        fix="pass the completion's token ids as ints (cosmos-rl: rollout_as_token_ids) or its text")
        at = (rollout_output.prompt_index, rollout_output.sample_index) if isinstance(rollout_output, RolloutSample) else (0, 0)
        row = RolloutSample(prompt, *at, ids, None, "stop").to_row(self.vision_tokens)
        if completed:  # the earlier assistant turns are scored too, as cosmos-rl's multi-turn packer scores them
            row.labels[:prompt.num_tokens] = prompt.labels
        if n_ignore_prefix_tokens:
            start = prompt.num_tokens
            row.labels[start:start + n_ignore_prefix_tokens] = IGNORE_INDEX
        return CosmosRow.of(row)

    def policy_compute_max_len(self, processed_samples: Sequence[MultiModalInputs]) -> int:
        """Length to pad the policy batch to: the longest policy row's token count."""
        return max(r.num_tokens for r in processed_samples)

    def policy_collate_fn(self, processed_samples: Sequence[MultiModalInputs], computed_max_len: int) -> dict[str, Any]:
        """The policy batch: the model's forward kwargs (input_ids / attention_mask int64
        [B, L], position_ids int64 [3, B, L] (text models: [B, L]), pixel data and grids when
        any row has images) and ``logprob_masks`` bool [B, L] at logit positions."""
        batch = self._collate(processed_samples, computed_max_len)
        out = batch.model_inputs(labels=False)
        out["logprob_masks"] = self._logprob_masks(processed_samples, batch)
        return out

    def _logprob_masks(self, rows: Sequence[MultiModalInputs], batch):
        """bool [B, L]: each `CosmosRow`'s own ``logprob_masks`` (as cosmos-rl may have set
        it) placed under the padding; other rows: their label mask shifted to logit positions."""
        import torch

        out = shift_to_logit_positions(batch.labels != IGNORE_INDEX)
        L = out.shape[1]
        for b, row in enumerate(rows):
            if isinstance(row, CosmosRow):
                m = torch.tensor(row.logprob_masks, dtype=torch.bool)
                out[b] = False
                if self.padding_side == "left":
                    out[b, L - len(m):] = m
                else:
                    out[b, :len(m)] = m
        return out

    # ---- SFT -----------------------------------------------------------------------------
    def sft_process_sample(self, sample: Any) -> CosmosRow:
        """An SFT item (chat list / row dict; an encoded row) -> a row labelled on its assistant tokens."""
        self._need_processor()
        row = encoded_sft_row(sample)
        return CosmosRow.of(self.sft_encoder.encode_row(self.to_row(sample)) if row is None else row)

    def sft_compute_max_len(self, processed_samples: Sequence[MultiModalInputs]) -> int:
        return max(r.num_tokens for r in processed_samples)

    def sft_collate_fn(self, sub_batch: Sequence[MultiModalInputs], computed_max_len: int,
                       ignore_label_id: int = IGNORE_INDEX) -> dict[str, Any]:
        """The SFT batch: forward kwargs plus ``label_ids`` int64 [B, L], NOT shifted (cosmos-rl's
        loss shifts), ``ignore_label_id`` outside targets (vision tokens are never targets)."""
        batch = self._collate(sub_batch, computed_max_len)
        out = batch.model_inputs(labels=False)
        labels = batch.labels.clone()
        labels[labels == IGNORE_INDEX] = ignore_label_id
        out["label_ids"] = labels
        return out

    # ---- batches -------------------------------------------------------------------------
    def _collate(self, rows: Sequence[MultiModalInputs], max_len: int):
        self._need_processor()
        check_fits(self, rows, max_len)
        return collate(rows, processor=self.processor, padding_side=self.padding_side, pad_to_length=max_len)

    def batch_size(self, batch: Any) -> int:
        return len(batch)

    def slice_batch(self, batch: Any, start: int, end: int) -> Any:
        return batch[start:end]

    @staticmethod
    def model_keys(policy_batch: dict) -> list[str]:
        """Keys of a policy / SFT batch that a transformers model's forward takes."""
        return [k for k in policy_batch if k not in ("logprob_masks", "label_ids")]


class DecoderOnlyLLMPackerCore(DataPackerCore):
    """Items are prompt strings or chat lists; the processor is a tokenizer.

    A string item is raw text, as cosmos-rl's own ``DecoderOnlyLLMDataPacker`` (0.4.7) takes it:
    no chat template is applied (a pre-templated dataset is not templated a second time), and it
    is tokenized without special tokens, as cosmos-rl's ``get_policy_input`` and
    ``sft_process_sample`` tokenize it. The rollout input holds those ids
    (``{"prompt_token_ids": ...}``: cosmos-rl hands the string itself to vLLM, which tokenizes it
    again and adds a BOS where the tokenizer has one; the ids here are the policy's). SFT on a
    string labels every token (cosmos-rl: ``label_ids = token_ids``). A chat list is rendered
    with the tokenizer's chat template (generation prompt added), as cosmos-rl does.
    """

    def encode_prompt(self, item: Any) -> MultiModalInputs:
        if isinstance(item, str):
            return self.raw_text_row(item, labels=False)
        return super().encode_prompt(item)

    def sft_process_sample(self, sample: Any) -> CosmosRow:
        if isinstance(sample, str):
            return CosmosRow.of(self.raw_text_row(sample, labels=True))
        return super().sft_process_sample(sample)

    def raw_text_row(self, text: str, *, labels: bool) -> MultiModalInputs:
        """A string item as a row: ``text`` tokenized as is (no template, no special tokens
        added); ``labels``: every token a target (SFT), else none (a prompt). The encoder's
        ``max_length`` applies (`Encoder.check_length`)."""
        self._need_processor()
        ids = np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        self.encoder.check_length(len(ids), "raw text item", fix="shorten the text or raise max_length")
        empty = MultiModalInputs.from_dict(self.encoder.empty_row_dict())
        # the text as the "response" of an empty prompt: positions 0..L-1, every token labelled
        row = RolloutSample(empty, 0, 0, ids, None, "stop").to_row()
        return row if labels else replace(row, labels=None)


class QwenVLPackerCore(DataPackerCore):
    """Items are chat lists whose content lists carry ``{"type": "image", "image": ...}``
    items (or Hub-style rows with an ``images`` column)."""

    def _check_family(self) -> None:
        if not self.encoder.family.is_vision:
            raise ArgumentError(
                f"QwenVLDataPacker needs a Qwen-VL processor (one of the vision families), got a "
                f"{self.encoder.family.name!r} one; use DecoderOnlyLLMDataPacker for text models"
            )


def _png_base64(image) -> str:
    """A PIL image as a base64 PNG string (lossless; cosmos-rl's ``decode_vision_info`` input)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


# ---- cosmos-rl's base class, resolved on first use -----------------------------------------
_CORES = {
    "DataPacker": (DataPackerCore, None),
    "DecoderOnlyLLMDataPacker": (DecoderOnlyLLMPackerCore, "DataPacker"),
    "QwenVLDataPacker": (QwenVLPackerCore, "DataPacker"),
}


def packer_class(name: str) -> type:
    """The public packer class ``name``: its core (the methods above) on top of cosmos-rl's
    ``BaseDataPacker`` when cosmos-rl is installed, standalone otherwise; one per process (`built_once`)."""
    return built_once(name, lambda: _build_class(name))


def _build_class(name: str) -> type:
    core, parent = _CORES[name]
    if parent is not None:
        bases = (core, packer_class(parent))
    else:
        base = cosmos_base_packer()
        bases = (core,) if base is None else (core, base)
    return type(name, bases, {"__module__": __name__, "__doc__": core.__doc__, "__qualname__": name})


def __getattr__(name: str):  # PEP 562: the public classes are built on first use
    if name in _CORES:
        return packer_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
