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
from typing import Any, Callable, Optional, Sequence

import numpy as np

from mmpipe.errors import InputError, PlaceholderError
from mmpipe.families import family_of
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.images.spec import VisionSpec
from mmpipe.rollout.inputs import as_rows, to_vllm_prompts

PIP_NAME = 'pip install "mmpipe[vllm]"'


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
            stage="rollout", column="logprobs",
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
                    stage="rollout", column="logprobs", fix="pass vLLM's RequestOutput unchanged",
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
    """

    def __init__(self, llm, *, processor, sampling_params_factory: Optional[Callable[..., Any]] = None,
                 check_prompt_ids: bool = True):
        if not callable(getattr(llm, "generate", None)):
            raise TypeError(f"llm must have a generate(prompts, sampling_params) method, got {type(llm).__name__}")
        if sampling_params_factory is None and importlib.util.find_spec("vllm") is None:
            raise ImportError(f"VLLMEngine needs vLLM: {PIP_NAME} (or pass sampling_params_factory=)")
        self.llm = llm
        self.processor = processor
        self.family = family_of(processor)
        self.spec = VisionSpec.from_processor(processor) if self.family.is_vision else None
        self.sampling_params_factory = sampling_params_factory
        self.check_prompt_ids = check_prompt_ids

    def sampling_params(self, params: SamplingParams):
        """Engine-neutral `SamplingParams` -> vLLM ``SamplingParams`` (greedy when temperature 0;
        ``logprobs=0``: only the sampled token's logprob)."""
        factory = self.sampling_params_factory
        if factory is None:
            try:
                from vllm import SamplingParams as factory  # lazy: optional extra
            except ImportError as e:
                raise ImportError(f"VLLMEngine needs vLLM: {PIP_NAME}") from e
        return factory(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            stop_token_ids=list(params.stop_token_ids),
            logprobs=0 if params.logprobs else None,
        )

    def generate(self, rows: Sequence, params: SamplingParams = SamplingParams()) -> list[Generation]:
        """rows: prompt `MultiModalInputs`, stored dicts, or a `BatchedMultiModalInputs`;
        returns one `Generation` per row, in order (``prompt_index`` = position)."""
        recs = as_rows(rows)
        prompts = to_vllm_prompts(recs, self.spec if self.spec is not None else self.family)
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
