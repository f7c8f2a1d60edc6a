"""`unbatch_rollout` without a processor reads a family's vision tokens from the prompt rows
(`VisionTokens.from_rows`). It took the token right after every image block for a "vision end"
even in families that have none (LLaVA-OneVision: the image run is followed by plain text), so a
response that sampled that ordinary text token was refused with a PlaceholderError "1 vision end
token(s) (?, id N)" - while the same rollout unbatched with the processor passed. Now only the
kinds the family table spells are read from rows (LLaVA-OneVision, InternVL: the image token)."""

from __future__ import annotations

import numpy as np

import mmpipe
from mmpipe import testing
from mmpipe.records.generation import Completion, Generation
from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.rollout import unbatch_rollout


def test_text_after_an_image_run_is_not_a_vision_end():
    """Before: PlaceholderError (the row-read 'vision end' was the text token after the images)."""
    proc = testing.build_processor("llava_onevision")
    prompt = mmpipe.encode_row({"messages": [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "describe it"}]}], "images": [testing.tiny_image(40, 56)]},
        proc, labels=False)
    ids, mm = np.asarray(prompt.input_ids), np.asarray(prompt.mm_token_type_ids)
    after = int(ids[np.flatnonzero(mm)[-1] + 1])  # the text token that follows the image run
    assert not np.isin(after, proc.tokenizer.convert_tokens_to_ids([proc.image_token]))
    reply = [after, after, int(proc.tokenizer.convert_tokens_to_ids("<|im_end|>"))]
    gens = [Generation(prompt_index=0, completions=[Completion(token_ids=reply, logprobs=[-1.0] * 3)])]
    want = [s.to_row() for s in unbatch_rollout([prompt], gens, processor=proc)]
    got = [s.to_row() for s in unbatch_rollout([prompt], gens)]
    assert [g.diff(w) for g, w in zip(got, want)] == [[]]
    assert VisionTokens.from_rows([prompt]).kinds == ("image pad",)
