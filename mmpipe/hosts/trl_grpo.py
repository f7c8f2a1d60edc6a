"""TRL ``GRPOTrainer`` on vision-language rows: mmpipe encodes the prompts, runs the rollout and
builds the policy batch; TRL keeps its loop, rewards, advantages and loss.

::

    args = GRPOConfig("out", per_device_train_batch_size=4, num_generations=2, max_completion_length=64,
                      temperature=1.0, **grpo_settings())
    trainer = VisionGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                                processing_class=processor)
    trainer.train()

The dataset holds raw rows in any format `mmpipe.encode` reads (TRL's own ``prompt`` messages +
``image`` / ``images`` included, string contents too: the images go before the first user text, as
TRL puts them; `mmpipe.hosts.trl_grpo_prompts`), encoded on the fly with ``labels=False`` as prompts (a ``completion`` column
and the assistant turns ending a ``messages`` conversation left out, as stock TRL generates
from ``prompt`` alone; the rewards get the whole ``messages``), or rows already encoded by
`mmpipe.encode_dataset` (``labels=False``; keep the reward's columns with ``keep_columns``).
Rows with 0, 1, 2 ... images mix in one batch. What the subclass changes, and where:

- ``rollout_func`` (TRL's hook): generation is `mmpipe.rollout.TransformersEngine` on the
  unwrapped model: the prompt rows' exact ids, their ``pixel_values`` / ``image_grid_thw`` /
  ``mm_token_type_ids``, the family's vision special tokens banned (``suppress_tokens``), TRL's
  EOS ids and sampling settings. Each completion goes through `mmpipe.rollout.rollout_rows`,
  which refuses a stray vision token (`PlaceholderError`); the rows are kept as
  ``trainer.last_rollout`` (one `MultiModalInputs` per completion, positions continued).
- ``_generate_and_score_completions``: TRL sees rows without ``image`` / ``images`` (so it
  neither re-renders nor re-processes them) and a ``prompt`` (the row's own, else the decoded
  prompt text); mmpipe's ``pixel_values`` [N, D], ``image_grid_thw`` [I, 3], ``num_images`` [B]
  and ``mm_token_type_ids`` [B, P+C] are added to its output, which TRL shuffles and splits per
  row (``split_pixel_values_by_grid``) into the optimisation batches. The reward functions get
  the rows' ``image`` / ``images`` columns back and the prompts with their images in the image
  parts (``_calculate_rewards``), as stock TRL gives them. At a temperature other than 1 the
  engine's logprobs (raw logits) are not handed to TRL as ``sampling_per_token_logps`` (its
  loss logprobs are of logits / T; its off-policy mask would read the difference as drift).
- ``_get_per_token_logps_and_entropies`` (TRL has no positions hook): each forward (old, ref and
  the loss) gets the images of its rows and ``position_ids`` [3, B, L] from `mmpipe.rope.get_rope_index`
  over TRL's layout (left-padded prompt + right-padded completion): the exact M-RoPE positions.

The rollout/training logprob gap (engine logprobs of the sampled tokens vs the training forward
before any update) is logged as ``rollout/logprob_gap/max`` and ``/mean`` whenever TRL computes
old logprobs, or always with ``measure_logprob_gap=True`` (one extra forward per generation
batch); only at ``temperature=1.0`` (TRL scales the training logits by the temperature, the
engine reports raw ones). Supported: the M-RoPE (patch-grid) families, images (no videos),
``use_vllm=False``, no ``tools`` / ``environment_factory``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import numpy as np
import torch

try:
    from trl import GRPOTrainer
    from trl.models.utils import unwrap_model_for_generation
except ImportError as e:  # pragma: no cover - trl is a test dependency
    raise ImportError("mmpipe.hosts.trl_grpo needs TRL: pip install 'trl>=1.16'") from e

from mmpipe.batching.checks import check_dataset_not_failed, check_not_failed
from mmpipe.compat import is_transformers_5
from mmpipe.errors import ArgumentError
from mmpipe.hosts.trl_grpo_prompts import IMAGE_KEYS, check_prompt_labels, is_encoded_row, raw_prompt, reward_prompts
from mmpipe.records.generation import SamplingParams
from mmpipe.records.row import MultiModalInputs
from mmpipe.rope import get_rope_index

__all__ = ["VisionGRPOTrainer", "grpo_settings"]


def grpo_settings(**yours: Any) -> dict[str, Any]:
    """``trl.GRPOConfig`` keywords for mmpipe rows: ``remove_unused_columns=False`` (TRL would keep
    only ``prompt`` / ``image`` / ``images``, dropping ``messages`` and every encoded column),
    ``use_vllm=False`` (generation is mmpipe's engine), ``bf16`` only where CUDA is present
    (TRL's default ``True`` needs a GPU). ``yours``: your own keywords merged in, as in
    `mmpipe.hosts.trainer.trainer_settings` (``GRPOConfig(**grpo_settings(bf16=True, ...))``)."""
    from mmpipe.hosts.trainer import merge_settings

    settings = {"remove_unused_columns": False, "use_vllm": False, "bf16": torch.cuda.is_available()}
    return merge_settings(settings, yours, "grpo_settings")


class VisionGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose prompts, rollout and policy batch are mmpipe's (module docstring).

    Takes GRPOTrainer's arguments (``processing_class``: the processor the rows are, or will be,
    encoded with) plus ``encode_options`` (`mmpipe.encode_row` keywords for raw rows, e.g.
    ``max_pixels``; raw rows get TRL's ``add_generation_prompt=True`` and ``GRPOConfig.chat_template_kwargs``
    unless these say otherwise) and ``measure_logprob_gap``. After each generation ``last_rollout`` holds the
    training rows (one `MultiModalInputs` per completion) and ``last_logprob_gap`` the per-token
    gaps (float32 [T], when measured).
    """

    def __init__(self, *args, encode_options: Optional[dict] = None, measure_logprob_gap: bool = False,
                 **kwargs):
        if kwargs.get("rollout_func") is not None:
            raise ArgumentError("VisionGRPOTrainer brings its own rollout_func (mmpipe's engine); "
                                "drop rollout_func=")
        for name in ("tools", "environment_factory"):
            if kwargs.get(name):
                raise ArgumentError(f"VisionGRPOTrainer does not support {name}= yet (TRL's tool loop generates "
                                    "with TRL's own path, which mmpipe's rows bypass); use "
                                    "mmpipe.rollout.AgentLoop")
        self.encode_options = dict(encode_options or {})
        self.measure_logprob_gap = measure_logprob_gap
        self.last_rollout: list[MultiModalInputs] = []
        self.last_logprob_gap: Optional[torch.Tensor] = None
        self._mm_pending: Optional[_PromptMedia] = None
        with warnings.catch_warnings():  # TRL warns that rollout_func is experimental
            warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
            super().__init__(*args, rollout_func=_rollout, **kwargs)
        self._check_settings()

    def _check_settings(self) -> None:
        from mmpipe.encoding.encoder import Encoder
        from mmpipe.families import family_of
        from mmpipe.rollout.transformers_engine import TransformersEngine

        if self.use_vllm:
            raise ArgumentError("VisionGRPOTrainer generates with mmpipe's TransformersEngine: pass "
                                "use_vllm=False (GRPOConfig(..., **mmpipe.hosts.trl_grpo.grpo_settings()))")
        if self.repetition_penalty != 1.0 or self.min_p is not None:
            raise ArgumentError(f"repetition_penalty={self.repetition_penalty}, min_p={self.min_p}: mmpipe's "
                                "engine samples with temperature / top_p / top_k only; leave them at 1.0 / None")
        self.engine_class = TransformersEngine
        self._family = family_of(self.processing_class)
        evals = getattr(self, "eval_dataset", None)  # failed encoded rows refused now, not when a batch reaches them
        for ds in [self.train_dataset, *(evals.values() if isinstance(evals, Mapping) else [evals])]:
            check_dataset_not_failed(ds, "VisionGRPOTrainer", stage="rollout")
        # the prompt as TRL renders it: apply_chat_template(add_generation_prompt=True, **chat_template_kwargs)
        options = {"add_generation_prompt": True, **self.encode_options, "labels": False}
        kwargs = self.chat_template_kwargs if isinstance(self.chat_template_kwargs, Mapping) else {}
        if kwargs:
            options["chat_template_kwargs"] = {**kwargs, **(self.encode_options.get("chat_template_kwargs") or {})}
        self._encoder = Encoder(self.processing_class, **options)

    # ---- prompts: dataset rows -> mmpipe prompt rows + what TRL sees -----------------------------
    def _prompt_row(self, x: Any, i: int) -> MultiModalInputs:
        """Row ``i`` of a generation batch -> its prompt record (encoded rows as they are)."""
        if isinstance(x, MultiModalInputs):
            return check_prompt_labels(x, i)
        if is_encoded_row(x):  # a raw row's own 'family' column (a reward kwarg) is no encoding marker
            check_not_failed(x, "rollout", first=i)  # an on_error="skip" placeholder is no prompt
            return check_prompt_labels(MultiModalInputs.from_dict(x, row=i), i)
        return self._encoder.encode_row(raw_prompt(x, i), i)

    def _trl_row(self, x: Any, row: MultiModalInputs) -> dict:
        """What TRL reads of a row: its columns without images, and a ``prompt`` (the row's own,
        else the prompt text with its special tokens); rewards receive the other columns."""
        cols = {k: v for k, v in x.items() if k not in IMAGE_KEYS} if isinstance(x, Mapping) else {}
        if "prompt" not in cols:
            cols["prompt"] = self.processing_class.decode(np.asarray(row.input_ids).tolist())
        return cols

    def _generate_and_score_completions(self, inputs: list) -> dict:
        # TRL repeats each prompt num_generations times in a row: one encode (and image processing) each
        rows = []
        for i, x in enumerate(inputs):
            rows.append(rows[-1] if i and _same_input(x, inputs[i - 1]) else self._prompt_row(x, i))
        # the image columns TRL does not see (`_trl_row`) go with the rows to the reward functions
        images = [{k: x[k] for k in IMAGE_KEYS if k in x} if isinstance(x, Mapping) else {} for x in inputs]
        self._mm_pending = _PromptMedia(rows, self.processing_class, images)
        try:
            out = super()._generate_and_score_completions([self._trl_row(x, r) for x, r in zip(inputs, rows)])
            out.update(self._mm_pending.loss_inputs(out["prompt_ids"].shape[1], out["completion_ids"].shape[1],
                                                    out["prompt_ids"].device))
            self._log_logprob_gap(out)
            if self.temperature != 1.0:
                # the engine's logprobs are of the raw logits, TRL's loss ones of logits / T: left in,
                # TRL's off-policy mask would read their difference as policy drift. Without them TRL
                # uses its own old logprobs, as with its transformers generation.
                out.pop("sampling_per_token_logps", None)
        finally:
            self._mm_pending = None
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards, with each row's ``image`` / ``images`` column given back: stock
        ``GRPOTrainer`` passes every dataset column to the reward functions (``images=[...]``, one
        entry per completion) and the prompts with the images in their image parts; ``_trl_row``
        took the images out only to keep TRL from re-processing them."""
        media = self._mm_pending
        if media is not None and len(media.image_columns) == len(inputs) and any(media.image_columns):
            inputs = [{**x, **cols} for x, cols in zip(inputs, media.image_columns)]
            prompts = reward_prompts(prompts, media.image_columns)
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    # ---- rollout (TRL's rollout_func) -----------------------------------------------------------
    def _mm_rollout(self) -> dict:
        from mmpipe.rollout.results import rollout_rows

        rows = self._mm_pending.rows
        params = SamplingParams(max_new_tokens=self.max_completion_length, n=1, temperature=self.temperature,
                                top_p=self.top_p, top_k=self.top_k or 0, stop_token_ids=tuple(self.eos_token_ids))
        # what TRL's own generate path enters: the unwrapped model (DeepSpeed / FSDP gathered,
        # gradient checkpointing off), its generation config overridden by TRL's
        unwrapped = unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation,
            generation_kwargs=self.generation_kwargs,
            gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)
        with unwrapped as model, torch.no_grad(), self._dist.summon_full_params(self.model_wrapped, recurse=False):
            _settle_generation_config(model)
            gens = self.engine_class(model, self.processing_class).generate(rows, params)
        # the training rows, checked: a completion holding a vision token is refused (PlaceholderError)
        self.last_rollout = rollout_rows(rows, gens, self.processing_class)
        done = [g.completions[0] for g in gens]
        return {"prompt_ids": [np.asarray(r.input_ids).tolist() for r in rows],
                "completion_ids": [list(c.token_ids) for c in done], "logprobs": [c.logprobs for c in done]}

    # ---- the forwards: old / ref logprobs and the loss --------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                           pixel_values=None, image_grid_thw=None, num_images=None,
                                           mm_token_type_ids=None, **other):
        """TRL's per-token logprobs [B, C] (+ entropies, aux loss) of the completion tokens, each
        forward with its rows' images and mmpipe's M-RoPE positions over TRL's layout."""
        if num_images is None and self._mm_pending is not None:  # TRL's calls inside _generate_and_score
            media = self._mm_pending.loss_inputs(input_ids.shape[1] - logits_to_keep, logits_to_keep,
                                                 input_ids.device)
            pixel_values, image_grid_thw = media.get("pixel_values"), media.get("image_grid_thw")
            num_images, mm_token_type_ids = media["num_images"], media["mm_token_type_ids"]
        if num_images is None or mm_token_type_ids is None:
            raise ArgumentError("VisionGRPOTrainer's forward got a batch without mmpipe's num_images / "
                                "mm_token_type_ids: the batch did not come from its _generate_and_score_completions")
        grids = image_grid_thw if image_grid_thw is not None else torch.zeros((0, 3), dtype=torch.long)
        positions, _ = get_rope_index(input_ids, mm_token_type_ids, grids, attention_mask=attention_mask,
                                      family=self._family)
        return self._chunked_logps(model, input_ids, attention_mask, positions, mm_token_type_ids, pixel_values,
                                   grids, num_images, logits_to_keep, batch_size or input_ids.size(0),
                                   compute_entropy, compute_aux_loss)

    def _chunked_logps(self, model, ids, mask, positions, types, pixels, grids, num_images, keep, size,
                       compute_entropy, compute_aux_loss):
        """TRL's chunked fused-head forward, each chunk with its rows' images and positions."""
        cum_img = np.concatenate([[0], np.cumsum(num_images)])
        cum_patch = np.concatenate([[0], np.cumsum(grids.prod(-1).tolist())]).astype(np.int64)
        logps, ents, aux = [], [], []
        for s in range(0, ids.size(0), size):
            e = min(s + size, ids.size(0))
            kw = {"input_ids": ids[s:e], "attention_mask": mask[s:e], "mm_token_type_ids": types[s:e],
                  "position_ids": positions[:, s:e].to(ids.device)}
            i0, i1 = int(cum_img[s]), int(cum_img[e])
            if i1 > i0:
                kw["pixel_values"] = pixels[int(cum_patch[i0]):int(cum_patch[i1])]
                kw["image_grid_thw"] = grids[i0:i1]
            if compute_aux_loss:
                kw["output_router_logits"] = True
            labels = kw["input_ids"].masked_fill(kw["attention_mask"] == 0, -100)
            labels[:, :-keep] = -100  # only the completion is scored
            with self.accelerator.autocast():
                out = model(**kw, labels=labels, fused_lm_head=True)
            logps.append(out.log_probs[:, -keep:])
            if compute_entropy:
                ents.append(out.entropy[:, -keep:])
            if compute_aux_loss:
                aux.append(out.aux_loss)
        return (torch.cat(logps), torch.cat(ents) if compute_entropy else None,
                torch.stack(aux).mean() if compute_aux_loss else None)

    # ---- the rollout/training logprob gap ---------------------------------------------------------
    def _log_logprob_gap(self, out: dict) -> None:
        sampled = out.get("sampling_per_token_logps")
        if sampled is None or self.temperature != 1.0:
            return
        old = out.get("old_per_token_logps")
        if old is None and not self.measure_logprob_gap:
            return
        if old is None:
            with torch.no_grad():
                old, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, torch.cat([out["prompt_ids"], out["completion_ids"]], 1),
                    torch.cat([out["prompt_mask"], out["completion_mask"]], 1), out["completion_ids"].shape[1],
                    batch_size=self.args.per_device_train_batch_size, pixel_values=out.get("pixel_values"),
                    image_grid_thw=out.get("image_grid_thw"), num_images=out["num_images"],
                    mm_token_type_ids=out["mm_token_type_ids"])
        gap = (old.float() - sampled.float()).abs()[out["completion_mask"].bool()]
        self.last_logprob_gap = gap.detach().cpu()
        mode = "train" if self.model.training else "eval"
        if gap.numel():
            self._metrics[mode]["rollout/logprob_gap/max"].append(gap.max().item())
            self._metrics[mode]["rollout/logprob_gap/mean"].append(gap.mean().item())


def _rollout(prompts: list, trainer: VisionGRPOTrainer) -> dict:
    """TRL's ``rollout_func(prompts, trainer)``: the prompts TRL passes are the display ones; the
    rows generated from are those `VisionGRPOTrainer._generate_and_score_completions` encoded."""
    if trainer._mm_pending is None or len(trainer._mm_pending.rows) != len(prompts):
        raise ArgumentError("the rollout ran outside VisionGRPOTrainer._generate_and_score_completions")
    return trainer._mm_rollout()


class _PromptMedia:
    """The prompt rows of one generation batch and their images as the loss takes them:
    ``pixel_values`` float32 [N, D] + ``image_grid_thw`` int64 [I, 3] (mmpipe's collate),
    ``num_images`` [B] and each row's prompt token types."""

    def __init__(self, rows: Sequence[MultiModalInputs], processor, image_columns: Sequence[dict] = ()):
        import mmpipe

        for i, r in enumerate(rows):
            if r.num_videos:
                raise ArgumentError(f"row {i} holds videos: VisionGRPOTrainer passes images only (TRL splits "
                                    "pixel_values per row by image_grid_thw); drop the videos or use verl / cosmos-rl")
        self.rows = list(rows)
        self.image_columns = list(image_columns)  # each row's image / images columns, for the rewards
        batch = mmpipe.collate(self.rows, processor=processor, padding_side="left")
        if batch.position_ids is None or np.ndim(batch.position_ids) != 3:
            raise ArgumentError(f"family {batch.family!r} has 1-D positions: VisionGRPOTrainer supports the "
                                "M-RoPE (patch-grid) families; use trl.GRPOTrainer with raw rows for it")
        self.vision = {k: v for k, v in batch.model_inputs(labels=False).items()
                       if k in ("pixel_values", "image_grid_thw")}
        self.num_images = [int(r.num_images) for r in self.rows]
        self.types = [torch.as_tensor(np.asarray(r.mm_token_type_ids), dtype=torch.long) for r in self.rows]

    def loss_inputs(self, prompt_width: int, completion_width: int, device) -> dict:
        """The forward kwargs in TRL's layout: token types [B, P+C] (prompt left-padded to ``P``,
        completion 0), the images, ``num_images``."""
        types = torch.zeros((len(self.rows), prompt_width + completion_width), dtype=torch.long)
        for b, t in enumerate(self.types):
            types[b, prompt_width - len(t):prompt_width] = t
        out = {"mm_token_type_ids": types.to(device), "num_images": list(self.num_images)}
        out.update({k: v.to(device) for k, v in self.vision.items()})
        return out


def _same_input(a: Any, b: Any) -> bool:
    """Whether two dataset rows are equal (a prompt TRL repeated: the same row read again, images
    decoded again); False where they cannot be compared (arrays)."""
    try:
        return a is b or bool(a == b)
    except (ValueError, TypeError):  # numpy arrays, tensors: not a repeat worth checking
        return False


def _settle_generation_config(model) -> None:
    """transformers 4.x: TRL's ``unwrap_model_for_generation(generation_kwargs=...)`` swaps in
    ``GenerationConfig.from_dict(config.to_dict())``, which keeps ``_from_model_config=True`` (a
    model built from its config, a checkpoint without generation_config.json) but drops
    ``_original_object_hash``; 4.57's ``generate()`` without an explicit ``generation_config``
    then fails with an AttributeError on it. TRL's own generate passes that config explicitly (no
    legacy model-config lookup); marking the temporary copy not-from-model-config does the same."""
    config = getattr(model, "generation_config", None)
    if is_transformers_5() or config is None or hasattr(config, "_original_object_hash"):
        return  # 5.x: TRL leaves the model's own config in place; never edit that one
    config._from_model_config = False
