"""Multi-agent, multi-turn conversations (ReMA): the turn-taking rollout and per-role encoding.

Several agent roles (e.g. a meta-thinker and a reasoner) take turns on each question for up
to ``max_num_turns`` rounds. Each role sees its own view of the conversation: the first role
gets the question, later roles the question plus the first role's latest message (ReMA's
views; any view is configurable). A round asks every role once, in ``agent_roles`` order, with
ONE batched engine call per role over the rows still running. A row ends at the end of the
round in which a finish role's response contains ``finish_flag`` (``finish_reason ==
"finish_flag"``), or when the rounds run out (``"max_turns"``). Questions may carry images;
every role's view holds each of them once, and their pixel data is encoded once per question.

Data flow::

    questions --rollout (engine calls)--> Episode per question --collate_episodes--> ReMABatch
                                               |                                       |
                              encode_conversation(role's view)              to_arrow / from_arrow

    batch = rollout(["What is 3 + 4?"], engine, processor, agent_roles=["meta", "reasoner"],
                    system_prompts={"meta": "Plan.", "reasoner": "Solve."}, max_num_turns=3,
                    finish_flag="[FINISH]")
    batch.batch["reasoner_labels"]                     # int64 [B, L]
    model(**batch.model_inputs("reasoner", labels=True))

Conversations are text: a response is the engine's completion decoded with special tokens
skipped (vLLM's ``CompletionOutput.text``) and normalised as the tokenizer normalises text.
Training ids are the tokenizer/processor ids of the whole rendered conversation (one
tokenizer call, so nothing drifts at turn borders); labels are located by character spans.
If a response starts with characters the tokenizer merges with the template's text before
it (e.g. a leading newline with the real Qwen vocabulary), the merged token starts in the
template and is not a target; the rest of the response is.
"""

from mmpipe.rema.batch import PAD_CONTENT, PAD_ROLE, collate_episodes, conversation_pad_entry, history_pad_entry, history_size
from mmpipe.records.rema import ROLE_TENSORS, rema_arrow_schema
from mmpipe.records.rema import ReMABatch
from mmpipe.records.rema import RoleEncoding
from mmpipe.rema.encode import RoleCodec, encode_conversation, response_text
from mmpipe.rema.rollout import FINISH_FLAG, MAX_TURNS, rollout, run_episodes
from mmpipe.records.rema import Episode
from mmpipe.rema.views import AskQuestion, QuestionWithInstruction, View, ViewContext, rema_views

__all__ = [
    "FINISH_FLAG", "MAX_TURNS", "PAD_ROLE", "PAD_CONTENT", "ROLE_TENSORS", "ViewContext", "View", "AskQuestion",
    "QuestionWithInstruction", "rema_views", "RoleEncoding", "RoleCodec", "encode_conversation", "response_text", "Episode",
    "rollout", "run_episodes", "collate_episodes", "ReMABatch", "rema_arrow_schema", "history_size",
    "history_pad_entry", "conversation_pad_entry",
]
