"""ReMA's rules, restated independently as a test oracle.

Read from ReMA's released source (ziyuwan/ReMA-public, src/verl/verl/workers/rollout/
vllm_rollout/vllm_rollout_spmd.py: ``encode_conversation``, ``_build_tensor_dict``,
``_prepare_final_output``, ``_update_history_and_check_finish``; the actor
``workers/actor/dp_rema_actor.py`` uses ``labels`` as the rolled (next-token) ids):

- a role's training conversation = its ``{role}_conversation_history`` + its last response as
  an assistant message;
- for each assistant message: query = the chat template over the messages before it with the
  generation prompt; ids = tokens of ``query + response`` (the last such ids are input_ids);
  labels / step_ids are SHIFTED: ``len(query_ids) - len(previous ids) - 1`` ignored entries,
  then for stop reason "stop" the response tokens + EOS (step on all), for "length" the response
  tokens + -100 (step on the response only), for the placeholder reasons
  ("stop_when_truncated", "completion_token_exceeded") the (empty) response + -100 with no step,
  and the encoding stops there;
- num_gen_tokens per turn: response + 1 ("stop"), response ("length"), 0 (placeholder);
  stop_reasons per turn: 0 for "stop", 1 otherwise; turn_finished: 0 None, 1 reach_max_turn,
  2 completion_token_exceeded, 3 stop_when_truncated;
- position_ids (text) = ``clip(cumsum(attention_mask) - 1, 0)``; tensors padded to a fixed length.
"""

from __future__ import annotations

IGNORE = -100
PLACEHOLDER_REASONS = ("stop_when_truncated", "completion_token_exceeded")
FINISH_CODE = {None: 0, "reach_max_turn": 1, "completion_token_exceeded": 2, "stop_when_truncated": 3}


def _ids(proc, text: str, images) -> list[int]:
    """Tokens of a rendered text: the processor (image pads expanded) or the tokenizer."""
    if hasattr(proc, "image_processor"):
        out = proc(text=[text], images=list(images) or None, return_tensors="np")
        return [int(t) for t in out["input_ids"][0]]
    return list(proc(text, add_special_tokens=False)["input_ids"])


def _images_in(messages, images) -> list:
    n = sum(isinstance(m["content"], list) and sum(it.get("type") == "image" for it in m["content"]) for m in messages)
    return list(images)[:n]


def reference_encode(conversation: list[dict], proc, stop_reasons: list[str], images=()) -> dict:
    """ReMA's encoding of one role's conversation: input_ids, labels, step_ids, num_gen_tokens."""
    tok = getattr(proc, "tokenizer", proc)
    eos = tok.eos_token_id
    labels, steps, num = [], [], []
    ids: list[int] = []
    cur_len, history, step = 0, [], 0
    for msg in conversation:
        if msg["role"] in ("system", "user"):
            history.append(msg)
            continue
        query = proc.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
        response = msg["content"]
        imgs = _images_in(history, images)
        q_ids = _ids(proc, query, imgs)
        ids = _ids(proc, query + response, imgs)
        resp = ids[len(q_ids):]
        pad = len(q_ids) - cur_len - 1
        labels += [IGNORE] * pad
        steps += [IGNORE] * pad
        reason = stop_reasons[step]
        if reason == "stop":
            labels += resp + [eos]
            steps += [step] * (len(resp) + 1)
            num.append(len(resp) + 1)
        elif reason in PLACEHOLDER_REASONS:
            assert response == ""
            labels += resp + [IGNORE]
            steps += [IGNORE] * (len(resp) + 1)
            num.append(0)
            break
        else:  # "length"
            labels += resp + [IGNORE]
            steps += [step] * len(resp) + [IGNORE]
            num.append(len(resp))
        step += 1
        cur_len = len(ids)
        history.append(msg)
    assert len(ids) == len(labels) == len(steps)
    return {"input_ids": ids, "labels": labels, "step_ids": steps, "num_gen_tokens": num}
