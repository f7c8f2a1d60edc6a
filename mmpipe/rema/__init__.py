"""Multi-agent, multi-turn conversations (ReMA): the turn-taking rollout and per-role encoding.

Several agent roles (e.g. a meta-thinker and a reasoner) take turns on each question for up
to ``max_num_turns`` rounds. Each role sees its own view of the conversation: the first role
gets the question, later roles the question plus the first role's latest message (ReMA's
views; any view is configurable). A round asks every role once, in ``agent_roles`` order, with
ONE batched engine call per role over the rows still running. ReMA's ending rules and
finish reasons (`mmpipe.rema.rollout`): the finish flag (None), ``"reach_max_turn"``,
``"completion_token_exceeded"`` (``prompt_length``), ``"stop_when_truncated"``. Questions may
carry images; every role's view holds each of them once, and their pixel data is encoded
once per question. The batch is what ReMA's trainer reads (`mmpipe.records.rema`: shifted
labels, per-turn ``num_gen_tokens`` / ``stop_reasons``, ``turn_finished``, fixed ``max_length``).

Data flow::

    questions --rollout (engine calls)--> Episode per question --collate_episodes--> ReMABatch
                                               |                                       |
                              encode_conversation(role's view)              to_arrow / from_arrow

    batch = rollout(["What is 3 + 4?"], engine, processor, agent_roles=["meta", "reasoner"],
                    system_prompts={"meta": "Plan.", "reasoner": "Solve."}, max_num_turns=3,
                    finish_flag="[FINISH]")
    batch.batch["reasoner_labels"]                     # int64 [B, L], shifted as ReMA's
    model(**batch.model_inputs("reasoner", labels=True))    # the loss at ReMA's positions

Conversations are text: a response is the engine's completion decoded with special tokens
skipped (vLLM's ``CompletionOutput.text``) and normalised as the tokenizer normalises text.
Training ids are the tokenizer/processor ids of the whole rendered conversation (one
tokenizer call, so nothing drifts at turn borders); labels are located by character spans.
If a response starts with characters the tokenizer merges with the template's text before
it (e.g. a leading newline with the real Qwen vocabulary), the merged token starts in the
template and is not a target; the rest of the response is.
"""

from mmpipe.rema.batch import (COMPLETION_TOKEN_EXCEEDED, FINISH_CODES, PAD_CONTENT, PAD_ROLE, REACH_MAX_TURN,
                               STOP_WHEN_TRUNCATED, collate_episodes, conversation_pad_entry, history_pad_entry,
                               history_size)
from mmpipe.records.rema import ROLE_TENSORS, ROLE_TURN_TENSORS, rema_arrow_schema
from mmpipe.records.rema import ReMABatch
from mmpipe.records.rema import RoleEncoding
from mmpipe.rema.actor import ACTOR_KEYS, actor_micro_batch, forward_micro_batch, patch_actor
from mmpipe.rema.encode import RoleCodec, encode_conversation, response_text
from mmpipe.rema.rollout import FINISH_FLAG, MAX_TURNS, rollout, run_episodes
from mmpipe.records.rema import Episode
from mmpipe.rema.views import AskQuestion, QuestionWithInstruction, View, ViewContext, rema_views

__all__ = [
    "FINISH_FLAG", "MAX_TURNS", "REACH_MAX_TURN", "COMPLETION_TOKEN_EXCEEDED", "STOP_WHEN_TRUNCATED", "FINISH_CODES",
    "PAD_ROLE", "PAD_CONTENT", "ROLE_TENSORS", "ROLE_TURN_TENSORS", "ViewContext", "View", "AskQuestion",
    "QuestionWithInstruction", "rema_views", "RoleEncoding", "RoleCodec", "encode_conversation", "response_text", "Episode",
    "rollout", "run_episodes", "collate_episodes", "ReMABatch", "rema_arrow_schema", "history_size",
    "history_pad_entry", "conversation_pad_entry", "forward_micro_batch", "patch_actor", "actor_micro_batch",
    "ACTOR_KEYS",
]
