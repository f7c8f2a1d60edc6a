"""Memory over a long RL run (hunt): the agent loop keeps nothing of a finished `AgentLoop.run`.
Each run builds its own `Encoder` (`MultiTurnBatch.start`); the tool-role cache of
`mmpipe.rollout.tool_calls` held every one of them for the life of the process (one more
live Encoder per run, i.e. per RL step, with its processor settings, fingerprints and
render caches). Counted, not timed: live Encoder objects after the runs."""

from __future__ import annotations

import gc
import json

from mmpipe.encoding.encoder import Encoder
from mmpipe.records.generation import Completion, Generation, SamplingParams
from mmpipe.rollout.agent import AgentLoop

from conftest import processor_for

CALL = '<tool_call>\n' + json.dumps({"name": "look", "arguments": {"q": "x"}}) + '\n</tool_call>'


class ToolThenAnswer:
    """Our test double of an engine: a tool call on the first turn, a plain answer on the next."""

    def __init__(self, tok):
        self.tok, self.end = tok, tok.convert_tokens_to_ids("<|im_end|>")

    def generate(self, rows, params):
        out = []
        for i, row in enumerate(rows):
            turn = self.tok.decode(list(row.input_ids)).count("<|im_start|>assistant") - 1
            ids = self.tok(CALL if turn == 0 else "Done.", add_special_tokens=False)["input_ids"] + [self.end]
            out.append(Generation(i, [Completion(ids, None, "stop")]))
        return out


def live_encoders() -> int:
    gc.collect()
    return sum(isinstance(o, Encoder) for o in gc.get_objects())


def test_finished_runs_leave_no_encoder_alive():
    proc = processor_for("qwen2_vl")
    loop = AgentLoop(ToolThenAnswer(proc.tokenizer), proc, {"look": lambda q: f"nothing about {q}"}, max_turns=3)
    prompt = {"messages": [{"role": "user", "content": "question"}]}
    trajs = loop.run([prompt], SamplingParams(max_new_tokens=64))
    assert trajs[0].num_turns == 2 and trajs[0].turns[0].tool_outputs == ("nothing about x",)  # the tool ran
    del trajs
    before = live_encoders()
    for _ in range(6):
        loop.run([prompt], SamplingParams(max_new_tokens=64))
    assert live_encoders() == before  # was before + 6: one Encoder kept per run
