"""VLM-judge rewards: score frames with a vision-language model behind an
OpenAI-compatible server (``vllm serve Qwen/Qwen3-VL-8B-Instruct``), for ``dataset.map``
over rollout rows and as an environment wrapper for RL loops.

One file per concept, in the order a frame flows::

    frames.py      image -> data URL + sha256                         (EncodedFrame)
    prompts.py     the two questions, their JSON schemas, message layout (image first)
    client.py      one chat completion: timeout, bounded concurrency, retries (JudgeClient)
    parsing.py     tolerant JSON parsing of answers                   (ActionVerdict, ProgressEstimate)
    arithmetic.py  reward modes, weights, scale, progress term        (RewardConfig, combine)
    judge.py       both questions per frame, concurrency, cache       (VLMJudge.judge / judge_many)
    dataset.py     ds.map(judge.score, batched=True)                  (score_batch)
    env.py         gymnasium-style wrapper, sync or async             (VLMRewardWrapper)
    stats.py       counters and the answer cache                      (JudgeStats, AnswerCache)
    records.py     the typed records                                  (JudgeResult, StepScore, ...)

Only ``client.py`` needs the optional ``openai`` package (``pip install "mmpipe[judge]"``),
imported on the first request. Quick check of a server: ``mmpipe judge ping --base-url
URL --model NAME --image PATH``.
"""

from __future__ import annotations

from mmpipe.reward.arithmetic import MODES, RewardConfig, combine
from mmpipe.reward.client import JudgeClient
from mmpipe.reward.env import VLMRewardWrapper
from mmpipe.reward.frames import EncodedFrame, encode_frame
from mmpipe.reward.judge import VLMJudge
from mmpipe.reward.parsing import extract_json, parse_action, parse_progress
from mmpipe.reward.prompts import ACTION_SCHEMA, PROGRESS_SCHEMA, JudgePrompts
from mmpipe.records.reward import (
    ActionVerdict,
    Answer,
    FrameAnswers,
    JudgeResult,
    ProgressEstimate,
    Reply,
    RewardParts,
    StepScore,
)
from mmpipe.reward.stats import AnswerCache, JudgeStats

__all__ = [
    "ACTION_SCHEMA", "MODES", "PROGRESS_SCHEMA", "ActionVerdict", "Answer", "AnswerCache", "EncodedFrame",
    "FrameAnswers", "JudgeClient", "JudgePrompts", "JudgeResult", "JudgeStats", "ProgressEstimate", "Reply",
    "RewardConfig", "RewardParts", "StepScore", "VLMJudge", "VLMRewardWrapper", "combine", "encode_frame",
    "extract_json", "parse_action", "parse_progress",
]
