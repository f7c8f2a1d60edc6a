"""VLM-judge rewards: score frames with a vision-language model behind an
OpenAI-compatible server (``vllm serve Qwen/Qwen3-VL-8B-Instruct``), for ``dataset.map``
over rollout rows and as an environment wrapper for RL loops.

One file per concept, in the order a frame flows::

    frames.py      image -> data URL + sha256                         (EncodedFrame)
    prompts.py     the two questions, their JSON schemas, message layout (image first)
    client.py      one chat completion: timeout, bounded concurrency, retries (JudgeClient)
    deadline.py    a deadline for a whole HTTP request (RequestDeadline)
    parsing.py     tolerant JSON parsing of answers                   (ActionVerdict, ProgressEstimate)
    arithmetic.py  reward modes, weights, scale, progress term        (RewardConfig, combine)
    judge.py       both questions per frame, concurrency, cache       (VLMJudge.judge / judge_many)
    dataset.py     ds.map(judge.score, batched=True)                  (score_batch, FrameScorer)
    env.py         gymnasium-style wrapper, sync or async             (VLMRewardWrapper)
    gym_wrapper.py the same as a real gymnasium.Wrapper, on demand     (VLMRewardGymWrapper)
    stats.py       counters and the answer cache                      (JudgeStats, AnswerCache)
    (mmpipe/records/reward.py: the typed records                     (JudgeResult, StepScore, ...))

Only ``client.py`` needs the optional ``openai`` package (``pip install "mmpipe[judge]"``),
imported on the first request; ``gym_wrapper.py`` needs ``gymnasium`` (``pip install
"mmpipe[gym]"``), imported when ``VLMRewardGymWrapper`` is first used. Quick check of a server: ``mmpipe judge ping --base-url
URL --model NAME --image PATH``.
"""

from __future__ import annotations

from mmpipe.reward.arithmetic import (
    CONFIDENCES,
    MODES,
    PROGRESS_TERMS,
    RewardConfig,
    action_term,
    combine,
    confidence_of,
    progress_term,
)
from mmpipe.reward.client import PIP_HINT, JudgeClient, require_openai
from mmpipe.reward.dataset import FrameScorer, score_batch
from mmpipe.reward.env import VLMRewardWrapper
from mmpipe.reward.frames import EncodedFrame, encode_frame
from mmpipe.reward.judge import VLMJudge
from mmpipe.reward.parsing import extract_json, parse_action, parse_progress, verdict_probability
from mmpipe.reward.prompts import (
    ACTION_SCHEMA,
    ACTION_SCHEMA_NAME,
    DEFAULT_ACTION_PROMPT,
    DEFAULT_PROGRESS_PROMPT,
    PROGRESS_SCHEMA,
    PROGRESS_SCHEMA_NAME,
    JudgePrompts,
    build_messages,
    format_primitives,
    response_format,
)
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
    "ACTION_SCHEMA", "ACTION_SCHEMA_NAME", "CONFIDENCES", "DEFAULT_ACTION_PROMPT", "DEFAULT_PROGRESS_PROMPT", "MODES",
    "PIP_HINT", "PROGRESS_SCHEMA", "PROGRESS_SCHEMA_NAME", "PROGRESS_TERMS", "ActionVerdict", "Answer", "AnswerCache",
    "EncodedFrame", "FrameAnswers", "FrameScorer", "JudgeClient", "JudgePrompts", "JudgeResult", "JudgeStats",
    "ProgressEstimate", "Reply", "RewardConfig", "RewardParts", "StepScore", "VLMJudge", "VLMRewardWrapper",
    "action_term", "build_messages", "combine", "confidence_of", "encode_frame", "extract_json", "format_primitives",
    "parse_action", "parse_progress", "progress_term", "require_openai", "response_format", "score_batch",
    "verdict_probability",
]  # VLMRewardGymWrapper (needs gymnasium) is left out: `import *` must not need it


def __getattr__(name: str):
    if name == "VLMRewardGymWrapper":  # imports gymnasium: only on demand
        from mmpipe.reward.gym_wrapper import VLMRewardGymWrapper

        return VLMRewardGymWrapper
    raise AttributeError(f"module 'mmpipe.reward' has no attribute {name!r}")
