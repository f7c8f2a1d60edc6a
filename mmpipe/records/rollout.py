"""`RolloutSample`: one sampled completion of one prompt (what unbatching rollout results
gives), and the training row it becomes. Positions follow `mmpipe.records`: ``[3, L]`` per row
for the patch grids, ``[L]`` for the 1-D families; a response continues them on every row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Union

import numpy as np

from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.display_hooks import Displayed
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.vision_tokens import VisionTokens


@dataclass(eq=False)
class RolloutSample(Displayed):
    """One sampled completion of one prompt.

    Attributes:
        prompt:         the prompt row (shared, not copied, by the samples of one prompt).
        prompt_index:   index of the prompt in the rollout batch.
        sample_index:   0..n-1 within the prompt's group.
        response_ids:   int64 [R] generated ids (EOS included when emitted).
        logprobs:       float32 [R] rollout-time logprobs of the sampled tokens, or None.
        finish_reason:  "stop", "length" or "abort".
        stop_reason:    the stop token id (int) or string that ended it, or None.
        vision_tokens:  the tokenizer's vision special tokens and the policy for one in the
                        response (`mmpipe.records.vision_tokens.VisionTokens`, set by
                        ``unbatch_rollout(..., processor=, on_vision_token=)``); None: `to_row`
                        uses the ids the prompt itself shows and refuses.
    """

    _html_kind = "rollout_html"  # a class attribute, not a field: the `Displayed` renderer

    prompt: MultiModalInputs
    prompt_index: int
    sample_index: int
    response_ids: np.ndarray
    logprobs: Optional[np.ndarray]
    finish_reason: str
    stop_reason: Optional[Union[int, str]] = None
    vision_tokens: Optional[VisionTokens] = None

    @property
    def prompt_ids(self) -> np.ndarray:
        """int64 [P] the prompt's ids, unpadded, placeholders expanded."""
        return self.prompt.input_ids

    @property
    def response_mask(self) -> np.ndarray:
        """int64 [R]: 1 on every generated token (the completion is already cut at EOS), 0 on
        the vision tokens that `to_row` masks under ``on_vision_token="mask"``."""
        mask = np.ones(len(self.response_ids), dtype=np.int64)
        vt = self.vision_tokens
        if vt is not None and vt.policy == "mask":
            mask[vt.find(self.response_ids)] = 0
        return mask

    @property
    def response_positions(self) -> np.ndarray:
        """int64 [3, R] (the prompt's position rows: [R] for a 1-D family): generated token k at
        ``max(prompt positions) + 1 + k`` on every row."""
        start = int(self.prompt.position_ids.max()) + 1 if self.prompt.num_tokens else 0
        pos = start + np.arange(len(self.response_ids), dtype=np.int64)
        return np.broadcast_to(pos, self.prompt.position_ids.shape[:-1] + (len(pos),)).copy()

    @property
    def position_ids(self) -> np.ndarray:
        """int64 [3, P+R] M-RoPE positions of prompt + response ([P+R] for a 1-D family)."""
        return np.concatenate([self.prompt.position_ids, self.response_positions], axis=-1)

    def to_row(self, vision_tokens: Optional[VisionTokens] = None) -> MultiModalInputs:
        """The training row: prompt + response, labels = response ids (-100 on the prompt).

        Pixel arrays are the prompt's own objects (no copy). A vision special token in the
        response is refused (`mmpipe.errors.PlaceholderError`, stage "rollout", naming the
        prompt, sample, position and token) or, under policy "mask", replaced by the pad id with
        label -100. The tokens: ``vision_tokens``, else the sample's, else those the prompt
        shows (`VisionTokens.from_rows`: a prompt without images shows none; collate with a
        processor still refuses pads)."""
        vt = vision_tokens or self.vision_tokens or VisionTokens.from_rows([self.prompt])
        p = self.prompt
        r, resp_labels = vt.apply(self.response_ids.astype(np.int64), self.response_ids.astype(np.int64),
                                  where=f"prompt {self.prompt_index}, sample {self.sample_index}",
                                  row=self.prompt_index, offset=p.num_tokens)
        R = len(r)
        return replace(
            p,
            input_ids=np.concatenate([p.input_ids, r]),
            attention_mask=np.ones(p.num_tokens + R, dtype=np.int64),
            mm_token_type_ids=np.concatenate([p.mm_token_type_ids, np.zeros(R, np.int64)]),
            position_ids=self.position_ids,
            rope_delta=p.rope_delta,  # each response token advances positions by exactly 1
            labels=np.concatenate([np.full(p.num_tokens, IGNORE_INDEX, np.int64), resp_labels]),
        )

    def __repr__(self) -> str:
        return (
            f"RolloutSample(prompt={self.prompt_index}.{self.sample_index}, prompt_tokens={self.prompt.num_tokens}, "
            f"images={self.prompt.num_images}, response_tokens={len(self.response_ids)}, finish={self.finish_reason!r})"
        )

