"""Rollout engine over an OpenAI-compatible HTTP server (``vllm serve``, ``transformers serve``).

Each encoded prompt row becomes one ``/v1/chat/completions`` request whose single message
holds the row's prompt text and its images (PNG data URIs of the stored resized images,
`mmpipe.rollout.images.row_images`), rendered by a *verbatim* chat template sent with the
request: text parts as they are, each image as the family's one image pad. The server's
prompt is therefore the row's own tokens (the template is never applied twice); its
processor re-expands each pad from the same image, as vLLM does offline.

What comes back depends on the server (``server=``):

- ``"vllm"``: the request adds ``chat_template``, ``add_generation_prompt=False``,
  ``return_token_ids``, ``return_tokens_as_token_ids``, ``skip_special_tokens=False``,
  ``mm_processor_kwargs`` (`vllm_processor_kwargs`), ``stop_token_ids``, ``top_k`` and a
  ``logit_bias`` of -100 on the vision tokens unless ``params.allow_vision_tokens``. Back come
  the exact sampled ids (``choices[i].token_ids``), the sampled tokens' logprobs and the
  expanded ``prompt_token_ids`` (vLLM >= 0.10.2).
- ``"transformers"`` (``transformers serve``): the template goes in
  ``chat_template_kwargs``; ``n`` is sent as ``n`` requests (seeds ``seed, seed+1, ...``).
  It returns text only (leading whitespace stripped) and no logprobs, so ids are the text
  re-tokenized: ``Completion.token_ids_exact`` is False and ids may differ from the sampled
  ones. It cannot ban tokens, so it needs ``allow_vision_tokens=True``, nor take
  ``stop_token_ids`` (refused).

vLLM refuses a request's ``chat_template`` unless started with
``--trust-request-chat-template`` (recent versions; some also gate ``mm_processor_kwargs`` behind
``--trust-request-mm-kwargs``). Prompt ids the server reports (vLLM) must
equal the row's ``input_ids``; otherwise the expanded prompt length (``usage.prompt_tokens``)
must equal the row's length: a server that re-sized an image fails loudly.

    engine = OpenAIEngine("http://127.0.0.1:8000/v1", "my-model", processor=processor)
    gens = await engine.generate(rows, SamplingParams(max_new_tokens=256, n=8, temperature=1.0))

The ``openai`` client is imported lazily (``pip install "mmpipe[serve]"``).
"""

from __future__ import annotations

import base64
import io
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError, PlaceholderError
from mmpipe.records.generation import FINISH_REASONS, Completion, Generation, SamplingParams
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.async_engine import ConcurrencyGate, gather_or_cancel

__all__ = ["OpenAIEngine", "SERVERS", "verbatim_chat_template", "prompt_content", "request_body",
           "generation_from_chat_response"]

SERVERS = ("vllm", "transformers")
PIP_NAME = 'pip install "mmpipe[serve]"'


def verbatim_chat_template(image_token: str) -> str:
    """A Jinja chat template that renders each message's content parts as they are (text) or
    as ``image_token`` (an image part): the prompt text already holds the chat markup."""
    return ("{%- for m in messages -%}{%- if m['content'] is string -%}{{ m['content'] }}{%- else -%}"
            "{%- for c in m['content'] -%}{%- if c['type'] == 'text' -%}{{ c['text'] }}{%- else -%}"
            + image_token + "{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}")


def _data_uri(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")  # lossless: the server's processor sees the stored pixels
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def prompt_content(row, processor, *, index: Any = None, check_ids: bool = True) -> list[dict]:
    """The row's prompt as OpenAI content parts: ``{"type": "text", "text": ...}`` for each run
    of text tokens (decoded with special tokens kept) and ``{"type": "image_url", "image_url":
    {"url": "data:image/png;base64,..."}}`` where each image's pad run stands. Rows with
    videos raise NotImplementedError. ``check_ids``: each text run must be the tokenizer's own
    encoding of its text (`_text_part`), since the server tokenizes the text again."""
    from mmpipe.encoding.placeholders import collapse_placeholders
    from mmpipe.rollout.images import row_images, vision_spec_for

    r = MultiModalInputs.from_dict(row, row=index)
    if r.num_videos:
        raise NotImplementedError(f"row {index} holds {r.num_videos} video(s): server prompts carry images only")
    tok = getattr(processor, "tokenizer", processor)
    ids = [int(t) for t in r.input_ids]
    images: list = []
    if r.num_images:
        ids = [int(t) for t in collapse_placeholders(r.input_ids, r.mm_token_type_ids, r.image_grid_thw,
                                                    family=r.fam, row=index)]
        images = row_images(r, vision_spec_for(processor, r.fam, index=index), index=index)
    pad = tok.convert_tokens_to_ids(r.fam.image_token) if r.fam.image_token else None
    parts, run, k = [], [], 0
    for t in ids + [None]:
        if t is None or (t == pad and k < len(images)):
            if run:
                parts.append(_text_part(tok, run, index, len(parts), check_ids))
                run = []
            if t is not None:
                parts.append({"type": "image_url", "image_url": {"url": _data_uri(images[k])}})
                k += 1
        else:
            run.append(t)
    return parts


def _text_part(tok, run: list, index: Any, part: int, check: bool) -> dict:
    """Text ids [n] -> a text content part. With ``check``, ids that are not the tokenizer's
    encoding of their decoded text raise `InputError` (column "input_ids"): a sampled reply
    appended by a multi-turn / agent loop usually is not (sampling picks ``l``,``l`` where the
    tokenizer has ``ll``), and the server, re-tokenizing the text, would generate from other ids
    than the training row's (vLLM then reports a prompt mismatch; a text-only server none)."""
    text = tok.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    again = tok.encode(text, add_special_tokens=False) if check else run
    if list(again) != list(run):
        k = next((j for j, (a, b) in enumerate(zip(run, again)) if a != b), min(len(run), len(again)))
        raise InputError(
            "a server prompt's text", where=f"prompt {index}", row=index, column="input_ids", stage="rollout",
            expected="text ids that re-tokenize to themselves (a chat-completions server takes text, not ids)",
            found=f"text part {part}: ids {run[k:k + 3]} at its token {k} ({tok.decode(run[k:k + 3])!r}) re-tokenize "
                  f"as {list(again[k:k + 3])} ({len(run)} ids -> {len(again)})",
            fix="rows holding sampled replies (multi-turn, agent loops) need an engine that takes token ids: "
                "VLLMEngine / AsyncVLLMEngine (or the server's /v1/completions with token ids); or "
                "check_prompt_ids=False to accept a server prompt that differs from the training row")
    return {"type": "text", "text": text}


def request_body(row, params: SamplingParams, *, model: str, processor, server: str = "vllm",
                 index: Any = None, check_ids: bool = True) -> dict:
    """The JSON body of the chat-completions request for one row (``n`` completions; the
    ``"transformers"`` server takes one per request: the engine sends ``n`` of these).
    ``check_ids``: as `prompt_content`."""
    from mmpipe.records.vision_tokens import VisionTokens
    from mmpipe.rollout.images import vision_spec_for, vllm_processor_kwargs

    if server not in SERVERS:
        raise ArgumentError(f"server must be one of {SERVERS}, got {server!r}")
    r = MultiModalInputs.from_dict(row, row=index)
    template = verbatim_chat_template(r.fam.image_token or "")
    content = prompt_content(r, processor, index=index, check_ids=check_ids)
    body: dict = {"model": model, "messages": [{"role": "user", "content": content}],
                  "max_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p}
    if params.seed is not None:
        body["seed"] = params.seed
    banned = () if params.allow_vision_tokens else VisionTokens.from_processor(processor, family=r.fam).ids
    if server == "transformers":
        if banned:
            raise ArgumentError(
                "transformers serve cannot ban tokens (no logit_bias), so it may sample vision tokens: pass "
                "SamplingParams(allow_vision_tokens=True) and let to_row/collate refuse or replace them")
        if params.stop_token_ids:
            raise ArgumentError("transformers serve takes no stop_token_ids (it stops at the model's EOS): "
                                "leave SamplingParams.stop_token_ids empty for this server")
        body["chat_template_kwargs"] = {"chat_template": template}
        return body
    body.update(n=params.n, chat_template=template, add_generation_prompt=False, return_token_ids=True,
                skip_special_tokens=False, stop_token_ids=list(params.stop_token_ids))
    if params.logprobs:
        body.update(logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True)
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if banned:
        body["logit_bias"] = {str(i): -100 for i in banned}
    if r.num_images:
        spec = vision_spec_for(processor, r.fam, index=index)
        body["mm_processor_kwargs"] = vllm_processor_kwargs(r.image_grid_thw, spec, index=index, family=r.fam)
    return body


def _check_prompt(resp: dict, want, prompt_index: int) -> None:
    want = [int(t) for t in np.asarray(want).reshape(-1)]
    got = resp.get("prompt_token_ids")
    if got is not None:
        got = [int(t) for t in got]
        if got == want:
            return
        at = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
        found = f"server {got[at:at + 3]} ({len(got)} tokens)"
    else:
        n = (resp.get("usage") or {}).get("prompt_tokens")
        if n is None or int(n) == len(want):
            return
        at, found = None, f"{n} prompt tokens"
    raise PlaceholderError(
        "the server's prompt differs from the row's training input_ids" + (f" from position {at}" if at is not None else ""),
        where=f"prompt {prompt_index}", row=prompt_index, column="input_ids",
        expected=f"{len(want)} tokens" + (f", row {want[at:at + 3]}" if at is not None else ""), found=found,
        fix="serve the checkpoint (and processor pixel bounds) the rows were encoded with",
    )


def _choice_ids(choice: dict, tokenizer) -> tuple[list[int], bool]:
    """(generated ids, exact): the server's ids, else ids named by ``token_id:N`` logprob
    tokens, else the returned text re-tokenized (not exact)."""
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]], True
    content = (choice.get("logprobs") or {}).get("content") or []
    if content and all(str(c.get("token", "")).startswith("token_id:") for c in content):
        return [int(str(c["token"])[len("token_id:"):]) for c in content], True
    text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)], False


def generation_from_chat_response(resp: dict, prompt_index: int, *, tokenizer, expected_prompt_ids=None,
                                  eos_token_id: Optional[int] = None) -> Generation:
    """One chat-completions response (a dict) -> `Generation`, choices in ``index`` order.

    Completion ids as `_choice_ids`; logprobs from ``logprobs.content[j].logprob`` when the
    server returned one per id, else None. A re-tokenized completion that stopped
    (``finish_reason`` "stop") gets ``eos_token_id`` appended when the text lacks it (servers
    strip it), as engines that see ids report it. ``expected_prompt_ids``: int [L], checked
    as the module says.
    """
    if expected_prompt_ids is not None:
        _check_prompt(resp, expected_prompt_ids, prompt_index)
    completions = []
    for choice in sorted(resp.get("choices") or [], key=lambda c: c.get("index", 0)):
        ids, exact = _choice_ids(choice, tokenizer)
        reason = choice.get("finish_reason") or "abort"
        reason = reason if reason in FINISH_REASONS else "stop"  # e.g. "tool_calls": the model stopped
        if not exact and reason == "stop" and eos_token_id is not None and (not ids or ids[-1] != eos_token_id):
            ids.append(int(eos_token_id))
        content = (choice.get("logprobs") or {}).get("content") or []
        lps = [float(c["logprob"]) for c in content] if exact and len(content) == len(ids) else None
        stop = choice.get("stop_reason")
        completions.append(Completion(token_ids=ids, logprobs=lps, finish_reason=reason,
                                      stop_reason=stop if isinstance(stop, (int, str)) else None, token_ids_exact=exact))
    if not completions:
        raise InputError("the server's response has no choices", where=f"prompt {prompt_index}", stage="rollout",
                         column="choices", expected="at least one choice", found="none", fix="check the server's logs")
    return Generation(prompt_index=prompt_index, completions=completions)


_STANDARD = ("model", "messages", "max_tokens", "temperature", "top_p", "n", "seed", "logprobs", "top_logprobs",
             "logit_bias")


class OpenAIEngine:
    """`AsyncRolloutEngine` over an OpenAI-compatible chat-completions server.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000/v1"``.
        model: the served model name.
        processor: the processor the rows were encoded with (decodes prompt text, rebuilds images).
        server: ``"vllm"`` or ``"transformers"`` (see the module table).
        max_concurrency: HTTP requests in flight at once (``gate`` counts them).
        timeout, max_retries, api_key: for the ``openai.AsyncOpenAI`` client (transport errors
            are retried by the client; HTTP 4xx are not).
        check_prompt_ids: compare the server's prompt with each row's ``input_ids``, and refuse
            before sending a row whose text ids the server would tokenize differently (`_text_part`:
            a sampled reply in a multi-turn row).
        client: an ``openai.AsyncOpenAI`` the caller owns (reused, never closed here); by
            default each ``generate`` call opens its own client and closes it (an async HTTP
            client belongs to one event loop, and `run_sync` makes a new loop per call).

    A call that fails on one request cancels its other requests before it raises
    (`mmpipe.rollout.async_engine.gather_or_cancel`): none is left running on the server.
    """

    def __init__(self, base_url: str, model: str, *, processor, server: str = "vllm", max_concurrency: int = 8,
                 timeout: float = 600.0, max_retries: int = 2, api_key: str = "EMPTY", check_prompt_ids: bool = True,
                 client: Any = None):
        if server not in SERVERS:
            raise ArgumentError(f"server must be one of {SERVERS}, got {server!r}")
        self.base_url, self.model, self.processor, self.server = base_url, model, processor, server
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.gate = ConcurrencyGate(max_concurrency)
        self.timeout, self.max_retries, self.api_key = timeout, max_retries, api_key
        self.check_prompt_ids = check_prompt_ids
        self.client = client

    def _new_client(self):
        try:
            import openai  # lazy: optional dependency
        except ImportError as e:
            raise ImportError(f"OpenAIEngine needs the openai client: {PIP_NAME}") from e
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout,
                                  max_retries=self.max_retries)

    async def _post(self, client, body: dict) -> dict:
        std = {k: v for k, v in body.items() if k in _STANDARD}
        extra = {k: v for k, v in body.items() if k not in _STANDARD}
        resp = await self.gate.run_coro(lambda: client.chat.completions.create(**std, extra_body=extra or None))
        return resp.model_dump()

    async def _one(self, client, row: MultiModalInputs, i: int, params: SamplingParams) -> Generation:
        body = request_body(row, params, model=self.model, processor=self.processor, server=self.server, index=i,
                            check_ids=self.check_prompt_ids)
        if self.server == "vllm" or params.n == 1:
            resps = [await self._post(client, body)]
        else:  # one completion per request; seeds seed, seed+1, ... keep a seeded group reproducible
            bodies = [dict(body, seed=params.seed + k) if params.seed is not None else body for k in range(params.n)]
            resps = await gather_or_cancel(*(self._post(client, b) for b in bodies))
        want = row.input_ids if self.check_prompt_ids else None
        gens = [generation_from_chat_response(r, i, tokenizer=self.tokenizer, expected_prompt_ids=want,
                                              eos_token_id=self.tokenizer.eos_token_id) for r in resps]
        return Generation(prompt_index=i, completions=[c for g in gens for c in g.completions])

    async def generate(self, rows: Sequence, params: SamplingParams = SamplingParams()) -> list[Generation]:
        """rows: prompt rows or a batch; one `Generation` per row, in order, ``params.n`` completions each."""
        from mmpipe.rollout.inputs import prompt_rows
        from mmpipe.rollout.sampling import check_params

        check_params(params)
        recs = prompt_rows(rows)
        if self.client is not None:
            return await gather_or_cancel(*(self._one(self.client, r, i, params) for i, r in enumerate(recs)))
        async with self._new_client() as client:
            return await gather_or_cancel(*(self._one(client, r, i, params) for i, r in enumerate(recs)))
