"""The bad-input corpus of the rollout surfaces (issue 29): vLLM prompts over rows of the
generic path, of mixed families, with a processor of another family or of no kind at all, in
every form a user holds rows in; agent-loop tools whose failure cannot be printed or whose
output cannot become text, and sampled tool calls the default parser's json cannot read. Each case builds its own input (tiny processors, nothing
downloaded) and states its outcome: an error class with the row, column, stage and message words
it must carry, or success with a property that is checked. ``tests/rollout/
test_bad_rollout_inputs.py`` runs every case; `outcome_counts` tallies them (0 silent / 0 crash
/ 0 hang: a silent success, an untyped exception or a case past its time bound fails its test).

A case's ``run(ctx)`` calls ONE public surface (``mmpipe.rollout.to_vllm_prompts`` or
``AgentLoop.run``) and returns what it returned; ``check(result, ctx)`` asserts what must hold.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

import mmpipe
from mmpipe.errors import ArgumentError, FamilyMismatchError
from mmpipe.offline import tiny_image
from mmpipe.rollout.support import RolloutRefusal

from conftest import processor_for


@dataclass(frozen=True)
class Case:
    name: str
    surface: str  # "vllm_prompts" | "agent"
    run: Callable[["Ctx"], Any]
    raises: Optional[type] = None  # None: must succeed
    contains: tuple = ()  # substrings the message must hold
    row: Optional[int] = None  # the row the error must name (e.row and the message's "row N")
    err_stage: Optional[str] = None  # InputError.stage, for InputError subclasses
    column: Optional[str] = None  # InputError.column
    check: Optional[Callable[[Any, "Ctx"], None]] = None  # ok cases
    holds: str = ""  # what must hold, in words (the report)
    before: str = ""  # what the unfixed code did (the report)

    @property
    def outcome(self) -> str:
        return "ok: " + self.holds if self.raises is None else self.raises.__name__


# ---- inputs --------------------------------------------------------------------------------
RAW = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
       "images": [tiny_image(40, 56, seed=3)]}


class Ctx:
    """Processors and encoded rows, built once per test session."""

    @functools.cached_property
    def qwen(self):
        return processor_for("qwen2_vl")

    @functools.cached_property
    def qwen25(self):
        return processor_for("qwen2_5_vl")

    @functools.cached_property
    def gemma3(self):
        return processor_for("gemma3")

    @functools.cached_property
    def llava(self):  # a processor of the generic path (no mmpipe family table)
        from mmpipe.offline.other_vlms import build_foreign_processor

        return build_foreign_processor("llava")

    @functools.cached_property
    def rows(self) -> dict:
        return {"qwen": mmpipe.encode_row(RAW, self.qwen, labels=False),
                "qwen25": mmpipe.encode_row(RAW, self.qwen25, labels=False),
                "gemma3": mmpipe.encode_row(RAW, self.gemma3, labels=False),
                "generic": mmpipe.encode_row(RAW, self.llava, labels=False)}

    def row(self, which: str):
        return self.rows[which]

    @functools.cached_property
    def encoded(self):
        """A 2-row qwen2_vl dataset as ``encode_dataset`` stores it."""
        import datasets

        ds = datasets.Dataset.from_list([RAW, {**RAW, "images": [tiny_image(48, 32, seed=4)]}])
        enc, _ = mmpipe.encode_dataset(ds, self.qwen)
        return enc


def prompts(rows: Callable[[Ctx], Any], processor: Callable[[Ctx], Any] = lambda c: c.qwen, **kw):
    """A case's run: ``to_vllm_prompts(rows(ctx), processor(ctx), **kw)``."""
    from mmpipe.rollout import to_vllm_prompts

    return lambda ctx: to_vllm_prompts(rows(ctx), processor(ctx), **kw)


def same_as_rows(indices=(0, 1)):
    """The prompts equal those of the same rows given as a list of records."""
    def check(result, ctx):
        from mmpipe.rollout import to_vllm_prompts

        ref = to_vllm_prompts([mmpipe.MultiModalInputs.from_dict(ctx.encoded[i], row=i) for i in indices], ctx.qwen)
        assert len(result) == len(ref) == len(indices)
        for got, want in zip(result, ref):
            assert got["prompt_token_ids"] == want["prompt_token_ids"]
            assert got["mm_processor_kwargs"] == want["mm_processor_kwargs"]
            for a, b in zip(got["multi_modal_data"]["image"], want["multi_modal_data"]["image"]):
                assert np.array_equal(np.asarray(a), np.asarray(b))
    return check


# ---- the agent loop ------------------------------------------------------------------------
class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("__str__ itself failed")


class NonTextError(Exception):
    def __str__(self):
        return 42  # str() then raises TypeError


class Unprintable:
    def __str__(self):
        raise RuntimeError("__str__ itself failed")

    __repr__ = __str__


def _raise(e: BaseException):
    def tool(**kwargs):
        raise e
    return tool


def _call(name: str, **args) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


class ScriptEngine:
    """A `RolloutEngine` test double: turn k of every trajectory replies ``replies[k]``."""

    def __init__(self, processor, replies):
        self.tok, self.replies = processor.tokenizer, replies

    def generate(self, rows, params):
        from mmpipe.records.generation import Completion, Generation

        out = []
        for i, r in enumerate(rows):
            turn = self.tok.decode(r.input_ids.tolist()).count("<|im_start|>assistant") - 1
            ids = self.tok(self.replies[turn], add_special_tokens=False)["input_ids"] + [
                self.tok.convert_tokens_to_ids("<|im_end|>")]
            out.append(Generation(i, [Completion(ids, None, "stop")]))
        return out


def agent(tool: Callable = lambda **kw: "ok", *, workers: int = 1, reply: Optional[str] = None):
    """A case's run: one trajectory whose first reply is ``reply`` (default: a call of ``tool``),
    then a final answer."""
    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.agent import AgentLoop

    def run(ctx):
        first = _call("f", q="x") if reply is None else reply
        loop = AgentLoop(ScriptEngine(ctx.qwen, [first, "Done."]), ctx.qwen, {"f": tool},
                         max_turns=4, tool_workers=workers)
        return loop.run([RAW], SamplingParams(max_new_tokens=64))
    return run


def tool_failed(*words, start: str = "Error: tool 'f' "):
    """The call is recorded as failed (an error text the model reads: the tool's failure, or
    the call's when it does not parse) and the loop goes on to the final answer."""
    def check(trajs, ctx):
        (t,) = trajs
        assert t.finish_reason == "stop" and t.num_turns == 2
        assert t.turns[0].tool_errors == (True,)
        (text,) = t.turns[0].tool_outputs
        assert text.startswith(start), text[:200]
        for w in words:
            assert w in text, (w, text[:300])
        t.row.validate()
        assert text in ctx.qwen.tokenizer.decode(t.row.input_ids.tolist())  # the model was told
    return check


# ---- the corpus ----------------------------------------------------------------------------
NOT_A_ROLLOUT_ROW = "not available for generic rows"
ONE_MODEL = "one call per family"

CASES = [
    # -- the generic path: refused, naming the row
    Case("generic_rows", "vllm_prompts", prompts(lambda c: [c.row("generic")], lambda c: c.llava),
         RolloutRefusal, ("row 0: vLLM prompts", NOT_A_ROLLOUT_ROW, "mmpipe.Collator(processor)"), row=0,
         before="ArgumentError without the row (TypeError 'not subscriptable' before issue 26)"),
    Case("generic_stored_dict_after_qwen", "vllm_prompts",
         prompts(lambda c: [c.row("qwen"), c.row("generic").to_dict()], lambda c: None),
         FamilyMismatchError, ("row 1: encoded for 'generic'", "expected qwen2_vl rows", "found a generic row",
                               ONE_MODEL), row=1, err_stage="rollout", column="family",
         before="ArgumentError without the row (RolloutRefusal while the generic path had no vLLM prompts)"),
    Case("generic_row_with_a_qwen_processor", "vllm_prompts",
         prompts(lambda c: [c.row("qwen"), c.row("qwen"), c.row("generic")]),
         FamilyMismatchError, ("row 2: encoded for 'generic'", "expected qwen2_vl rows", "found a generic row",
                               ONE_MODEL), row=2, err_stage="rollout", column="family",
         before="ArgumentError without the row (RolloutRefusal while the generic path had no vLLM prompts)"),
    # -- mixed families: each row against its own family; the first that differs is named
    Case("qwen_then_gemma3", "vllm_prompts", prompts(lambda c: [c.row("qwen"), c.row("gemma3")]),
         FamilyMismatchError, ("row 1: encoded for 'gemma3'", "expected qwen2_vl rows", "found a gemma3 row",
                               ONE_MODEL), row=1, err_stage="rollout", column="family",
         before="ArgumentError 'needs the tiled family's processor' without the row (TypeError before issue 26)"),
    Case("gemma3_then_qwen", "vllm_prompts", prompts(lambda c: [c.row("gemma3"), c.row("qwen")], lambda c: c.gemma3),
         FamilyMismatchError, ("row 1: encoded for 'qwen2_vl'", "expected gemma3 rows", "found a qwen2_vl row",
                               ONE_MODEL), row=1, err_stage="rollout", column="family",
         before="FamilyMismatchError without the row (AttributeError before issue 26)"),
    Case("qwen_then_gemma3_no_processor", "vllm_prompts",
         prompts(lambda c: [c.row("qwen"), c.row("gemma3")], lambda c: None),
         FamilyMismatchError, ("row 1: encoded for 'gemma3', but row 0 is for 'qwen2_vl'", "expected qwen2_vl rows"),
         row=1, err_stage="rollout", column="family", before="ArgumentError without the row"),
    Case("two_patch_families_no_processor", "vllm_prompts",
         prompts(lambda c: [c.row("qwen"), c.row("qwen25")], lambda c: None),
         FamilyMismatchError, ("row 1: encoded for 'qwen2_5_vl'", "expected qwen2_vl rows", "found a qwen2_5_vl row"),
         row=1, err_stage="rollout", column="family",
         before="silent: two models' prompts in one list, each row with its own family's defaults"),
    # -- a processor (or name) of another family: vLLM's FamilyMismatchError names the row
    Case("qwen_rows_qwen25_processor", "vllm_prompts",
         prompts(lambda c: [c.row("qwen")], lambda c: c.qwen25),
         FamilyMismatchError, ("row 0: encoded for 'qwen2_vl'", "expected qwen2_5_vl rows"), row=0,
         err_stage="rollout", column="family", before="FamilyMismatchError without a row"),
    Case("qwen_rows_other_family_name", "vllm_prompts",
         prompts(lambda c: [c.row("qwen"), c.row("qwen")], lambda c: "gemma3"),
         FamilyMismatchError, ("row 0: encoded for 'qwen2_vl'", "processor_or_spec='gemma3'", "expected gemma3 rows"),
         row=0, err_stage="rollout", column="family",
         before="silent: prompts built with gemma3's image settings for qwen2_vl rows"),
    Case("gemma3_rows_no_processor", "vllm_prompts", prompts(lambda c: [c.row("gemma3")], lambda c: None),
         ArgumentError, ("row 0 (gemma3): ", "needs the tiled family's processor"), row=0,
         before="ArgumentError without the row"),
    # -- arguments that are not rows / processors / images
    Case("processor_not_a_processor", "vllm_prompts", prompts(lambda c: [c.row("qwen")], lambda c: 3),
         ArgumentError, ("processor_or_spec must be the processor the rows were encoded with", "got int"),
         before="TypeError: cannot tell the model family of int"),
    Case("rows_none", "vllm_prompts", prompts(lambda c: None),
         ArgumentError, ("rows must be encoded rows", "got NoneType"),
         before="TypeError: 'NoneType' object is not iterable"),
    Case("images_a_generator", "vllm_prompts",
         prompts(lambda c: [c.row("gemma3")], lambda c: c.gemma3, images=(x for x in [[RAW["images"][0]]])),
         ArgumentError, ("images= must hold one list of images per row (1 rows)", "got generator"),
         before="TypeError: object of type 'generator' has no len()"),
    # -- the forms rows come in: handled, the same prompts as a list of records
    Case("dataset_slice_of_columns", "vllm_prompts", prompts(lambda c: c.encoded[0:2]), check=same_as_rows(),
         holds="dataset[0:2] (a dict of columns) gives the prompts of its 2 rows",
         before="InputError 'no family column' (it has one: the dict's keys were taken as rows)"),
    Case("one_stored_row", "vllm_prompts", prompts(lambda c: c.encoded[1]), check=same_as_rows((1,)),
         holds="dataset[1] (one stored dict) gives that row's prompt",
         before="InputError 'no family column' (it has one)"),
    Case("arrow_table", "vllm_prompts", prompts(lambda c: mmpipe.ArrowRows(c.encoded).__getitems__([0, 1])),
         check=same_as_rows(), holds="an ArrowRows table gives the prompts of its rows",
         before="InputError 'no family column' (the table's columns were taken as rows)"),
    # -- the agent loop: a tool's failure is the model's observation, whatever it is
    Case("tool_exception_str_raises", "agent", agent(_raise(UnprintableError())),
         check=tool_failed("raised UnprintableError", "could not be read: RuntimeError"),
         holds="recorded as the tool's failure; the loop goes on",
         before="RuntimeError escaped AgentLoop.run"),
    Case("tool_exception_str_raises_threads", "agent", agent(_raise(UnprintableError()), workers=2),
         check=tool_failed("raised UnprintableError"), holds="the same with tool_workers=2",
         before="RuntimeError escaped AgentLoop.run"),
    Case("tool_exception_str_not_text", "agent", agent(_raise(NonTextError())),
         check=tool_failed("raised NonTextError", "could not be read: TypeError"),
         holds="recorded as the tool's failure", before="TypeError escaped AgentLoop.run"),
    Case("tool_returns_unprintable_value", "agent", agent(lambda **kw: {"answer": Unprintable()}),
         check=tool_failed("returned a value of type dict that cannot be turned into text"),
         holds="recorded as the tool's failure", before="RuntimeError escaped AgentLoop.run"),
    Case("tool_returns_huge_int", "agent", agent(lambda **kw: 10 ** 5000),
         check=tool_failed("returned a value of type int", "ValueError"),
         holds="recorded as the tool's failure", before="ValueError (int digit limit) escaped AgentLoop.run"),
    # -- the default parser (parse_qwen_tool_calls) on a sampled call json cannot read
    Case("call_nested_too_deep", "agent", agent(reply="<tool_call>" + "[" * 100_000 + "</tool_call>"),
         check=tool_failed("nested too deeply to read", start="Error: the tool call is not valid JSON"),
         holds="a malformed call: the model reads why, the loop goes on",
         before="RecursionError escaped AgentLoop.run"),
    Case("call_number_past_digit_limit", "agent",
         agent(reply='<tool_call>{"name": "f", "arguments": {"q": ' + "7" * 5000 + "}}</tool_call>"),
         check=tool_failed("a number too long to read", start="Error: the tool call is not valid JSON"),
         holds="a malformed call: the model reads why, the loop goes on",
         before="ValueError (int digit limit) escaped AgentLoop.run"),
]


def outcome_counts(cases: Optional[list] = None) -> dict:
    """``{"kinds", "clear_error": {class: n}, "handled", "silent", "crash", "hang",
    "undocumented"}``: every case raises a typed error with its words or succeeds with a checked
    property; a silent success, an untyped exception or a hang fails its test, so those stay 0."""
    from collections import Counter

    cases = CASES if cases is None else cases
    errors = Counter(c.raises.__name__ for c in cases if c.raises is not None)
    undocumented = [c.name for c in cases if not c.before or (c.raises is None and (not c.holds or c.check is None))
                    or (c.raises is not None and not c.contains)]
    return {"kinds": len(cases), "clear_error": dict(sorted(errors.items())),
            "handled": sum(c.raises is None for c in cases), "silent": 0, "crash": 0, "hang": 0,
            "undocumented": undocumented}


__all__ = ["Case", "CASES", "Ctx", "outcome_counts"]
