"""Rollout engine over ``vllm.LLM``: encoded rows in, engine-neutral `Generation` s out.

vLLM is an optional extra (``pip install "mmpipe[vllm]"``) and is imported only inside
`VLLMEngine.generate`; this module imports without it.

    llm = vllm.LLM(model=path, limit_mm_per_prompt={"image": 4})
    engine = VLLMEngine(llm, processor=processor)
    gens = engine.generate(rows, SamplingParams(max_new_tokens=256, n=8, temperature=1.0))

Prompts are `mmpipe.rollout.inputs.to_vllm_prompts` (one pad per image + the stored resized
images); vLLM expands the pads itself and reports the expanded ids in
``RequestOutput.prompt_token_ids``, which must equal the row's training ``input_ids``: that
is checked for every request, so a prompt whose placeholders were expanded twice, or whose
images vLLM re-sized to another grid, fails loudly instead of training on other tokens.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from typing import Any, Callable, Optional, Sequence

import numpy as np

from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError, InputError, PlaceholderError
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.images.spec import VisionSpec
from mmpipe.rollout.inputs import prompt_rows, to_vllm_prompts
from mmpipe.rollout.sampling import check_params
from mmpipe.rollout.support import check_processor

PIP_NAME = 'pip install "mmpipe[vllm]"'
VISION_TOKEN_BANS = ("bad_words", "logit_bias")
BAN_BIAS = -100.0  # the most negative bias vLLM's OpenAI server accepts; e^-100 is never sampled


def vllm_sampling_kwargs(params: SamplingParams, vision_tokens: Optional[VisionTokens] = None, *,
                         ban_with: str = "bad_words") -> dict[str, Any]:
    """Engine-neutral `SamplingParams` -> keyword arguments of ``vllm.SamplingParams`` (0.32).

    Greedy when temperature 0; ``top_k`` 0 -> -1 (all tokens); ``logprobs=0``: only the sampled
    token's logprob. Unless ``params.allow_vision_tokens``, the vision tokens are banned:

    - ``ban_with="bad_words"``: ``bad_words=[spellings]``. vLLM tokenizes each word with the
      model's tokenizer (a special token is one id, banned unconditionally with -inf); this
      needs the ``LLM``'s tokenizer (not ``skip_tokenizer_init=True``).
    - ``ban_with="logit_bias"``: ``logit_bias={id: -100}`` (ids, no tokenizer needed; -100 is
      what vLLM's API clamps biases to, a factor e^-100 on the token's probability).

    Either way vLLM's sampled-token logprobs are computed from the raw logits by default
    (``logprobs_mode="raw_logprobs"``), before bans, like the transformers engine's.
    ``allowed_token_ids`` (a whitelist of the whole vocabulary) is not used.
    """
    kw: dict[str, Any] = dict(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=params.max_new_tokens,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        logprobs=0 if params.logprobs else None,
    )
    if vision_tokens is not None and vision_tokens.ids and not params.allow_vision_tokens:
        if ban_with == "bad_words":
            kw["bad_words"] = list(vision_tokens.names)
        elif ban_with == "logit_bias":
            kw["logit_bias"] = {int(i): BAN_BIAS for i in vision_tokens.ids}
        else:
            raise ArgumentError(f"ban_with must be one of {VISION_TOKEN_BANS}, got {ban_with!r}")
    return kw


def _check_prompt_ids(got, want, prompt_index: int) -> None:
    got = [int(t) for t in got]
    want = [int(t) for t in np.asarray(want).reshape(-1)]
    if got == want:
        return
    n = min(len(got), len(want))
    at = next((i for i in range(n) if got[i] != want[i]), n)
    if len(got) > len(want):
        cause = "vLLM's prompt is longer: the image placeholders were expanded twice"
        fix = "give vLLM the collapsed ids of mmpipe.rollout.inputs.to_vllm_prompts, not the training input_ids"
    else:
        cause = "vLLM computed other image grids or tokens"
        fix = ("pass the prompt's mm_processor_kwargs from to_vllm_prompts and serve the checkpoint whose "
               "processor encoded the rows")
    raise PlaceholderError(
        f"vLLM's prompt_token_ids ({len(got)} tokens) differ from the row's training input_ids "
        f"({len(want)} tokens) from position {at}; {cause}", where=f"prompt {prompt_index}", row=prompt_index,
        column="input_ids", expected=f"row {want[at:at + 3]}", found=f"vLLM {got[at:at + 3]}", fix=fix,
    )


def _sampled_logprob(entry: Any, token: int, where: str) -> float:
    """The sampled token's logprob from one position's {token_id: Logprob} mapping."""
    lp = entry.get(token) if hasattr(entry, "get") else None
    if lp is None:
        keys = list(entry)[:5] if entry is not None else None
        raise InputError(
            f"the sampled token {token} is missing from vLLM's logprobs (keys {keys})", where=where,
            stage="rollout", column="logprobs", expected=f"token {token} among the keys", found=f"keys {keys}",
            fix="vLLM always includes the sampled token when SamplingParams.logprobs >= 0: pass vLLM's own outputs",
        )
    return float(getattr(lp, "logprob", lp))


def generation_from_request_output(req, prompt_index: int, *, expected_prompt_ids=None) -> Generation:
    """One vLLM ``RequestOutput`` -> `Generation` (duck-typed; no vLLM import).

    Reads the documented fields: ``req.prompt_token_ids`` (expanded ids) and ``req.outputs``,
    a list of ``CompletionOutput`` with ``index``, ``token_ids`` (generated only),
    ``logprobs`` (None, or per generated token a mapping ``{token_id: Logprob(logprob, rank,
    decoded_token)}`` that holds the sampled token), ``finish_reason`` ("stop", "length",
    "abort", ...; None while unfinished -> "abort") and ``stop_reason``.
    ``expected_prompt_ids``: the row's training input_ids int [L]; when given (and vLLM reports
    prompt ids) they must be equal, else ValueError (see `_check_prompt_ids`).
    """
    if expected_prompt_ids is not None and getattr(req, "prompt_token_ids", None) is not None:
        _check_prompt_ids(req.prompt_token_ids, expected_prompt_ids, prompt_index)
    outs = list(req.outputs)
    outs = sorted(outs, key=lambda c: getattr(c, "index", 0)) if all(hasattr(c, "index") for c in outs) else outs
    completions = []
    for k, c in enumerate(outs):
        ids = [int(t) for t in c.token_ids]
        lps: Optional[list[float]] = None
        if getattr(c, "logprobs", None) is not None:
            where = f"prompt {prompt_index}, completion {k}"
            if len(c.logprobs) != len(ids):
                raise InputError(
                    f"{len(c.logprobs)} logprob entries for {len(ids)} generated tokens", where=where,
                    stage="rollout", column="logprobs", expected=f"{len(ids)} entries", found=f"{len(c.logprobs)}",
                    fix="pass vLLM's RequestOutput unchanged",
                )
            lps = [_sampled_logprob(c.logprobs[j], t, f"{where}, token {j}") for j, t in enumerate(ids)]
        reason = getattr(c, "finish_reason", None)
        completions.append(Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=str(reason) if reason is not None else "abort",
            stop_reason=getattr(c, "stop_reason", None),
        ))
    return Generation(prompt_index=prompt_index, completions=completions)


def _accepted(factory, kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` without a ban keyword that a custom factory does not take (warned: the stages that
    build training rows still refuse vision tokens)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return kw
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kw
    dropped = [k for k in ("bad_words", "logit_bias") if k in kw and k not in params]
    if dropped:
        warnings.warn(f"sampling_params_factory takes no {dropped[0]}: vision tokens are not banned at sampling "
                      "(to_row / collate still refuse them); pass vllm.SamplingParams or a factory taking it",
                      UserWarning, stacklevel=4)
    return {k: v for k, v in kw.items() if k not in dropped}


class VLLMEngine:
    """`RolloutEngine` over a ``vllm.LLM`` (or any object with vLLM's ``generate``).

    Args:
        llm: ``vllm.LLM``; anything whose ``generate(prompts, sampling_params, use_tqdm=False)``
            returns vLLM ``RequestOutput`` s in prompt order.
        processor: the processor the rows were encoded with (images are unpatchified with its
            patch size; its pixel bounds go into each prompt's ``mm_processor_kwargs``).
        sampling_params_factory: builds the engine's sampling params from vLLM keyword names
            (default ``vllm.SamplingParams``); lets the engine run without vLLM in tests.
        check_prompt_ids: compare vLLM's expanded prompt ids with each row's ``input_ids``.
        vision_token_ban: how vision tokens are banned unless ``params.allow_vision_tokens``
            (`vllm_sampling_kwargs`): ``"bad_words"`` (default, an exact -inf ban) or
            ``"logit_bias"`` (for an ``LLM`` built with ``skip_tokenizer_init=True``).
    """

    def __init__(self, llm, *, processor, sampling_params_factory: Optional[Callable[..., Any]] = None,
                 check_prompt_ids: bool = True, vision_token_ban: str = "bad_words"):
        if vision_token_ban not in VISION_TOKEN_BANS:
            raise ArgumentError(f"vision_token_ban must be one of {VISION_TOKEN_BANS}, got {vision_token_ban!r}")
        if not callable(getattr(llm, "generate", None)):
            raise TypeError(f"llm must have a generate(prompts, sampling_params) method, got {type(llm).__name__}")
        if sampling_params_factory is None and importlib.util.find_spec("vllm") is None:
            raise ImportError(f"VLLMEngine needs vLLM: {PIP_NAME} (or pass sampling_params_factory=)")
        self.llm = llm
        self.processor = processor
        self.family = check_processor(processor, "generate")
        check_processor(processor, "vllm_engine")  # the generic path: refused, saying what to use
        self.spec = VisionSpec.from_processor(processor) if self.family.is_vision else None
        self.sampling_params_factory = sampling_params_factory
        self.check_prompt_ids = check_prompt_ids
        self.vision_tokens = VisionTokens.from_processor(processor, family=self.family)
        self.vision_token_ban = vision_token_ban

    def sampling_params(self, params: SamplingParams):
        """Engine-neutral `SamplingParams` -> vLLM ``SamplingParams`` (`vllm_sampling_kwargs`);
        `ArgumentError` for values no engine runs (`mmpipe.rollout.sampling.check_params`)."""
        check_params(params)
        factory = self.sampling_params_factory
        if factory is None:
            try:
                from vllm import SamplingParams as factory  # lazy: optional extra
            except ImportError as e:
                raise ImportError(f"VLLMEngine needs vLLM: {PIP_NAME}") from e
        kw = vllm_sampling_kwargs(params, self.vision_tokens, ban_with=self.vision_token_ban)
        if self.sampling_params_factory is not None:
            kw = _accepted(factory, kw)
        return factory(**kw)

    def generate(self, rows: Sequence, params: SamplingParams = SamplingParams()) -> list[Generation]:
        """rows: prompt `MultiModalInputs`, stored dicts, or a `BatchedMultiModalInputs`;
        returns one `Generation` per row, in order (``prompt_index`` = position)."""
        recs = prompt_rows(rows)
        if not recs:
            check_params(params)
            return []
        # the processor itself: each row's strategy takes what it needs (a patch grid's spec, a
        # tiled family's tokenizer and image texts)
        prompts = to_vllm_prompts(recs, self.processor, tokenizer=self.processor)
        outputs = list(self.llm.generate(prompts, self.sampling_params(params), use_tqdm=False))
        if len(outputs) != len(prompts):
            raise InputError(
                f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts", where="", stage="rollout",
                expected="one RequestOutput per prompt, in order", fix="check the llm object's generate()",
            )
        return [
            generation_from_request_output(o, i, expected_prompt_ids=recs[i].input_ids if self.check_prompt_ids else None)
            for i, o in enumerate(outputs)
        ]
