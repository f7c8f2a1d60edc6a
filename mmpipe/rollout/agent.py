"""The agent loop (rollout stage): generate, parse tool calls, run the tools, append their
text and images, and go on until a final answer or a budget; many trajectories at once.

    loop = AgentLoop(engine, processor, tools={"search": search}, max_turns=4, max_images=8)
    trajectories = loop.run(prompts, SamplingParams(max_new_tokens=256, temperature=1.0, seed=0))
    # (an engine with ``async def generate``: the same, or ``await loop.arun(...)`` in an event loop)
    rows = [t.row for t in trajectories]       # policy rows: labels = the model's tokens only
    gaps = logprob_gaps(model, trajectories, processor)   # rollout vs training logprobs

Each turn makes ONE batched ``engine.generate`` call over the trajectories still running (any
`RolloutEngine`); each reply is appended as generated (`mmpipe.rollout.multiturn`: never
re-tokenized, all labelled), its calls are parsed (``parser``, default
`parse_qwen_tool_calls`) and run, and their results go back as ONE tool turn (one ``tool``
message per call; templates without a tool role get a user turn with ``<tool_response>``
tags) with the images encoded and appended to the row (grids, pixels, positions).

Ends (``Trajectory.finish_reason``): a reply without a tool call ("stop", or "length" when the
engine cut it); ``max_turns`` replies; the row would pass ``max_tokens`` (the reply is cut to
fit, or the tool turn is not appended); the tool turn would bring the row past
``max_images`` (it is not appended); a sampled vision token (the reply is cut before it,
since a vision token in the text is an image slot with no image). A malformed call, an
unknown tool or a tool that raises never ends the loop: the model gets an error text.
The engine's model context (`engine_context`) bounds ``max_tokens``. A reply no rollout route
would train on (a stop id before its end, NaN / inf / positive logprobs, ...) is an `InputError`
(`_checked_replies`), noted with the prompt, sample and turn of the engine row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError
from mmpipe.records.conversation import Conversation
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.records.trajectory import AgentTurn, ToolCall, Trajectory
from mmpipe.rollout.multiturn import append_messages, append_response
from mmpipe.rollout.multiturn_batch import MultiTurnBatch
from mmpipe.rollout.async_engine import run_sync
from mmpipe.rollout.results import unbatch_rollout
from mmpipe.rollout.sampling import engine_context
from mmpipe.rollout.support import check_no_early_stop, stop_ids
from mmpipe.rollout.tool_calls import (
    parse_qwen_tool_calls,
    run_tool_call,
    tool_result_content,
    tool_role_of,
    tool_table,
)

__all__ = ["AgentLoop", "run_agent", "policy_logprobs_of", "logprob_gaps"]

_ROOM = 3  # the least room a reply needs: one token and a closing "<|im_end|>\n"


@dataclass
class _Track:
    """The loop's bookkeeping of one trajectory (turns so far, calls waiting for their tools)."""

    prompt_index: int
    sample_index: int
    tools: Optional[list] = None
    turns: list = field(default_factory=list)
    pending: list = field(default_factory=list)


class AgentLoop:
    """Runs tool-using conversations on any `RolloutEngine`, turn-synchronously.

    Args:
        engine: ``generate(rows, params) -> list[Generation]`` (`TransformersEngine`,
            `VLLMEngine`, ...), called once per turn with the running trajectories' rows.
        processor: the Qwen-VL processor (or tokenizer) the rows are encoded with.
        tools: ``{name: function}`` or a list of named functions; ``function(**arguments)``
            returns text, an image, a list of texts/images or ``(text, images)``.
        parser: ``text -> list[ToolCall]`` (``[]`` = final answer); default Qwen's format.
        max_turns: model replies per trajectory at most.
        max_tokens: tokens per trajectory row at most (prompt included), or None. The engine's
            model context (`engine_context`: ``max_position_embeddings``, vLLM's ``max_model_len``)
            bounds it too (``token_budget``): a trajectory that fills it ends ("max_tokens") instead
            of the engine refusing its prompt and the whole batch of trajectories with it.
        max_images: images per trajectory row at most (prompt images included), or None.
        tool_role: "auto" (the template's tool role if it renders one, else "user"), "tool" or "user".
        tool_workers: threads running one turn's tool calls (all trajectories) concurrently; 1 = in order.
        tool_specs: JSON-schema tool specs (``[{"type": "function", "function": {...}}]``) for
            the chat template's ``tools=`` (Qwen3-VL lists them in the system turn), or None.
        **encode_options: for the prompts' `Encoder` (``pixels=``, ``chat_template_kwargs=`` ...).

    ``engine_calls`` counts the ``generate`` calls made by this loop.
    """

    def __init__(self, engine, processor, tools: Any = (), *, parser: Callable[[str], Sequence[ToolCall]] = parse_qwen_tool_calls,
                 max_turns: int = 8, max_tokens: Optional[int] = None, max_images: Optional[int] = None,
                 tool_role: str = "auto", tool_workers: int = 1, tool_specs: Optional[list] = None,
                 **encode_options):
        if max_turns < 1 or (max_tokens is not None and max_tokens < 1) or (max_images is not None and max_images < 0):
            raise ArgumentError(f"max_turns must be >= 1, max_tokens >= 1 or None, max_images >= 0 or None; got "
                                f"max_turns={max_turns}, max_tokens={max_tokens}, max_images={max_images}")
        if tool_role not in ("auto", "tool", "user"):
            raise ArgumentError(f"tool_role must be one of ('auto', 'tool', 'user'), got {tool_role!r}")
        self.engine, self.processor, self.tools = engine, processor, tool_table(tools)
        self.parser, self.tool_role = parser, tool_role
        self.max_turns, self.max_tokens, self.max_images = max_turns, max_tokens, max_images
        budgets = [b for b in (max_tokens, engine_context(engine)) if b is not None]
        self.token_budget = min(budgets) if budgets else None
        if tool_specs is not None:  # through chat_template_kwargs: the template's tools= (a system block for Qwen3-VL)
            kw = dict(encode_options.get("chat_template_kwargs") or {})
            if "tools" in kw:
                raise ArgumentError("pass the tool specs once: tool_specs= or chat_template_kwargs['tools'], not both")
            encode_options["chat_template_kwargs"] = {**kw, "tools": list(tool_specs)}
        self.encode_options, self.tool_workers = encode_options, tool_workers
        self.engine_calls = 0

    # ---- the loop ------------------------------------------------------------------------
    def run(self, prompts: Sequence[dict], params: SamplingParams = SamplingParams()) -> list[Trajectory]:
        """Raw prompt rows (any format `mmpipe.encode` accepts) -> one `Trajectory` per prompt
        and sample (``params.n`` samples per prompt, prompt-major), in order. An engine whose
        ``generate`` is a coroutine (`AsyncRolloutEngine`) is run to completion each turn;
        inside an event loop use `arun`."""
        import inspect

        steps = self._steps(prompts, params)
        try:  # next() inside: every trajectory may end before the first turn (prompts over max_tokens)
            request = next(steps)
            while True:
                try:
                    gens = self.engine.generate(*request)
                    gens = run_sync(gens, caller="AgentLoop.run()", fix="its engine's generate() is a coroutine: "
                                    "use `await loop.arun(prompts, params)` there") if inspect.isawaitable(gens) else gens
                except InputError as e:  # thrown into the loop, which names the trajectory of its row
                    steps.throw(e)
                request = steps.send(gens)
        except StopIteration as done:
            return done.value

    async def arun(self, prompts: Sequence[dict], params: SamplingParams = SamplingParams()) -> list[Trajectory]:
        """`run` for an engine whose ``generate`` is a coroutine (awaited; one call per turn)."""
        import inspect

        steps = self._steps(prompts, params)
        try:  # as in run: the loop may end before the first turn
            request = next(steps)
            while True:
                try:
                    gens = self.engine.generate(*request)
                    gens = await gens if inspect.isawaitable(gens) else gens
                except InputError as e:  # as in run
                    steps.throw(e)
                request = steps.send(gens)
        except StopIteration as done:
            return done.value

    def _steps(self, prompts: Sequence[dict], params: SamplingParams):
        """The loop as a generator: yields each turn's (rows, params) for the engine, is sent
        its generations, returns the trajectories (so `run` and `arun` share it)."""
        n = params.n
        raw = [p for p in prompts for _ in range(n)]
        batch = MultiTurnBatch.start(raw, self.processor, **self.encode_options)
        column = self.encode_options.get("tools_column", "tools")
        tracks = [_Track(i // n, i % n, r.get(column) if isinstance(r, dict) else None) for i, r in enumerate(raw)]
        one = replace(params, n=1)
        while True:
            self._close_full(batch)
            idx = batch.active_indices
            if not idx:
                break
            room, rows = max(self._room(batch[i]) for i in idx), batch.active_rows()
            try:
                gens = yield rows, replace(one, max_new_tokens=min(one.max_new_tokens, room))
                self.engine_calls += 1
                replies = _checked_replies(rows, gens, batch[idx[0]].encoder)
            except InputError as e:  # the engine's "row k" is the k-th running trajectory, not prompt k
                if e.row is not None and 0 <= e.row < len(idx):
                    t = tracks[idx[e.row]]
                    e.add_note(f"(agent loop: engine row {e.row} is prompt {t.prompt_index}, sample "
                               f"{t.sample_index}, turn {len(t.turns)})")
                raise
            for i, g, reply in zip(idx, gens, replies):
                self._respond(batch, i, tracks[i], g.completions[0], *reply)
            waiting = batch.active_indices
            results = self._run_tools([tracks[i].pending for i in waiting])
            for i, res in zip(waiting, results):
                self._tool_turn(batch, i, tracks[i], res)
        return [self._trajectory(batch[i], t) for i, t in enumerate(tracks)]

    def _room(self, conv: Conversation) -> int:
        """New tokens a reply of ``conv`` may have under the token budget (huge when none)."""
        return 1 << 30 if self.token_budget is None else self.token_budget - conv.num_tokens - _ROOM + 1

    def _close_full(self, batch: MultiTurnBatch) -> None:
        """End the trajectories with no room left for a reply under ``max_tokens``."""
        for i, conv in batch.active():
            if self._room(conv) < 1:
                batch.mark_done(i, "max_tokens")

    # ---- one reply -----------------------------------------------------------------------
    def _respond(self, batch: MultiTurnBatch, i: int, track: _Track, c: Completion, ids: np.ndarray,
                 lps: Optional[np.ndarray]) -> None:
        """Append reply ``c`` (its checked ids int64 [R] and logprobs float32 [R] or None) to
        trajectory ``i`` (cut before a vision token / to the token budget, which ends it); parse
        its calls; end it on a final answer or ``max_turns``."""
        conv = batch[i]
        ended = None
        vision = np.flatnonzero(np.isin(ids, self._vision_ids(conv)))
        if len(vision):
            ids, ended = ids[:vision[0]], "vision_token"
        budget_cut = c.finish_reason == "length" and len(ids) >= self._room(conv)  # generate was capped at the room
        new, ids = self._fit(conv, ids)
        if new is None:  # not even an empty reply fits (a template closing a turn with > 2 tokens)
            batch.mark_done(i, "max_tokens")
            return
        if ended is None and (budget_cut or len(ids) < len(c.token_ids)):
            ended = "max_tokens"
        lps = None if lps is None else lps[:len(ids)]
        text = new.messages[-1]["content"]
        if ended is None and c.finish_reason == "abort":  # the engine gave up on it: no tool turn
            ended = "abort"
        calls = () if ended else tuple(self.parser(text))
        if ended is None and not calls:
            ended = c.finish_reason
        elif ended is None and len(track.turns) + 1 >= self.max_turns:
            ended = "max_turns"
        span = new.response_spans[-1]
        track.turns.append(AgentTurn(ids, lps, text, c.finish_reason, span, calls))
        batch.conversations[i] = new
        if ended is not None:
            batch.mark_done(i, ended)
        else:
            track.pending = list(calls)

    def _fit(self, conv: Conversation, ids: np.ndarray) -> tuple[Optional[Conversation], np.ndarray]:
        """append_response(conv, ids), cutting ids until the row fits ``max_tokens``
        (None when even no ids do not fit)."""
        while True:
            new = append_response(conv, ids)
            over = 0 if self.token_budget is None else new.num_tokens - self.token_budget
            if over <= 0:
                return new, ids
            if len(ids) == 0:
                return None, ids
            ids = ids[:max(len(ids) - over, 0)]

    def _vision_ids(self, conv: Conversation) -> list[int]:
        enc = conv.encoder
        return [v for v in enc.family.vision_token_ids(enc.tokenizer).values() if v is not None]

    # ---- one tool turn -------------------------------------------------------------------
    def _run_tools(self, calls: list[list[ToolCall]]) -> list[list]:
        """Every waiting trajectory's calls -> their (items, is_error) results, grouped the
        same way; on ``tool_workers`` threads when > 1 (tools that wait on I/O)."""
        flat = [c for cs in calls for c in cs]
        if self.tool_workers > 1 and len(flat) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(self.tool_workers, len(flat))) as pool:
                done = list(pool.map(lambda c: run_tool_call(c, self.tools), flat))
        else:
            done = [run_tool_call(c, self.tools) for c in flat]
        out, k = [], 0
        for cs in calls:
            out.append(done[k:k + len(cs)])
            k += len(cs)
        return out

    def _tool_turn(self, batch: MultiTurnBatch, i: int, track: _Track, results: list) -> None:
        """Append trajectory ``i``'s call results as one tool turn (or end it when the turn
        would pass ``max_images`` / ``max_tokens``)."""
        conv = batch[i]
        track.pending = []
        new_images = sum(sum(not isinstance(x, str) for x in items) for items, _ in results)
        if self.max_images is not None and conv.row.num_images + new_images > self.max_images:
            batch.mark_done(i, "max_images")
            return
        try:
            new = self._append_results(conv, results)
        except InputError as e:  # e.g. an image that does not decode: the model is told, the loop goes on
            why = _plain(f"Error: the tool output could not be added ({type(e).__name__}: {str(e)[:300]})", conv)
            results = [([why], True) for _ in results]
            new = self._append_results(conv, results)
        if self.token_budget is not None and new.num_tokens > self.token_budget:
            batch.mark_done(i, "max_tokens")
            return
        batch.conversations[i] = new  # MultiTurnBatch has no append_messages: set it directly
        texts = tuple("".join(x for x in items if isinstance(x, str)) for items, _ in results)
        track.turns[-1] = replace(track.turns[-1], tool_outputs=texts, tool_errors=tuple(e for _, e in results),
                                  num_images=new.row.num_images - conv.row.num_images)

    def _append_results(self, conv: Conversation, results: list) -> Conversation:
        """One message per call (role "tool"), or one user message with each result in
        ``<tool_response>`` tags when the template has no tool role."""
        role = tool_role_of(conv.encoder) if self.tool_role == "auto" else self.tool_role
        if role == "tool":
            parts = [tool_result_content(items) for items, _ in results]
            msgs = [{"role": "tool", "content": content} for content, _ in parts]
            images = [im for _, ims in parts for im in ims]
        else:  # Qwen's convention for templates without a tool role: one user turn, one tag pair per call
            items = [x for k, (its, _) in enumerate(results)
                     for x in ["\n" if k else "", "<tool_response>\n", *its, "\n</tool_response>"] if x != ""]
            content, images = tool_result_content(items)
            msgs = [{"role": "user", "content": content}]
        return append_messages(conv, msgs, images)

    def _trajectory(self, conv: Conversation, track: _Track) -> Trajectory:
        return Trajectory(row=conv.row, turns=tuple(track.turns), finish_reason=conv.finish_reason or "max_turns",
                          prompt_index=track.prompt_index, sample_index=track.sample_index,
                          messages=conv.messages, images=conv.images, tools=track.tools)


def _checked_replies(rows: list, gens: Sequence[Generation], encoder) -> list[tuple]:
    """One turn's generations for the running ``rows`` -> per row (ids int64 [R], logprobs float32
    [R] or None) of its first completion, refused as every rollout route refuses a response
    (`unbatch_rollout`, `check_no_early_stop`: `InputError` naming the engine row "prompt k")."""
    if len(gens) != len(rows) or any(not getattr(g, "completions", None) for g in gens):
        raise ArgumentError(f"the engine returned {len(gens)} generations for {len(rows)} prompts (or one "
                            "without a completion); a RolloutEngine returns one Generation per row")
    samples = unbatch_rollout(rows, [Generation(k, [g.completions[0]]) for k, g in enumerate(gens)])
    stops = stop_ids(encoder.tokenizer, encoder.family)
    for s in samples:
        check_no_early_stop(s.response_ids, stops, where=f"prompt {s.prompt_index}, sample 0", row=s.prompt_index)
    return [(s.response_ids, s.logprobs) for s in samples]


def _plain(text: str, conv: Conversation) -> str:
    """``text`` without the tokenizer's special-token strings (an error text quoting
    ``<|image_pad|>`` would itself be an image slot)."""
    for t in conv.encoder.tokenizer.get_added_vocab():
        text = text.replace(t, t.strip("<|>"))
    return text


def run_agent(prompts: Sequence[dict], engine, processor, tools: Any = (),
              params: SamplingParams = SamplingParams(), **loop_options) -> list[Trajectory]:
    """``AgentLoop(engine, processor, tools, **loop_options).run(prompts, params)``."""
    return AgentLoop(engine, processor, tools, **loop_options).run(prompts, params)


# ---- rollout / training consistency ------------------------------------------------------
def policy_logprobs_of(model, trajectories: Sequence[Trajectory], processor, *,
                       batch_size: int = 8) -> list[np.ndarray]:
    """Per trajectory, float32 [num_model_tokens]: the teacher-forced logprobs of the model's
    tokens in the final row (``transformers_engine.teacher_forced_logprobs`` on collated
    batches of ``batch_size`` rows), aligned with ``Trajectory.logprobs``."""
    from mmpipe.batching.collate import collate
    from mmpipe.rollout.transformers_engine import teacher_forced_logprobs

    out = []
    for s in range(0, len(trajectories), batch_size):
        chunk = trajectories[s:s + batch_size]
        batch = collate([t.row for t in chunk], processor=processor, padding_side="right")
        lp = teacher_forced_logprobs(model, batch).cpu().numpy()
        out += [lp[b, :t.row.num_tokens][t.response_mask.astype(bool)] for b, t in enumerate(chunk)]
    return out


def logprob_gaps(model, trajectories: Sequence[Trajectory], processor, **kwargs) -> np.ndarray:
    """float64 [T]: per trajectory, max |engine logprob - teacher-forced logprob| over the
    model's tokens (NaN where the engine gave no logprobs, 0.0 for no tokens): the
    rollout/training consistency check."""
    train = policy_logprobs_of(model, trajectories, processor, **kwargs)
    gaps = []
    for t, lp in zip(trajectories, train):
        roll = t.logprobs
        gaps.append(float("nan") if roll is None else float(np.abs(roll - lp).max()) if len(lp) else 0.0)
    return np.asarray(gaps, np.float64)
