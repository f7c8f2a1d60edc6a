"""The rollout half: encoded rows -> a rollout engine -> per-sample training rows.

Steps, in the order data flows (one module each)::

    support.py              which rollout stages take which family's rows (the media strategy says)
    inputs.py               rows / batch -> vLLM prompts (the family's strategy: one pad / image token
                            per image) or ``generate`` kwargs
    vllm_prompts.py         one row's vLLM prompt in the style its kind declares (collapse / splice / processor)
    images.py               a stored row's images rebuilt for the engine + vLLM's mm_processor_kwargs
    videos.py               a stored row's videos as vLLM takes them (frames + metadata, one pad each)
    data_parallel.py        pad a batch to a multiple of the data-parallel size, trim outputs back
    transformers_engine.py  engine over any transformers model; teacher-forced logprobs
    vllm_engine.py          engine over ``vllm.LLM`` (vLLM imported lazily, inside generate)
    async_engine.py         ``async generate``: any engine in a thread (bounded, merging waiting calls), vLLM AsyncLLM
    openai_engine.py        engine over an OpenAI-compatible server (vllm serve, transformers serve)
    results.py              engine outputs -> one `RolloutSample` per completion, training rows
    multiturn.py            multi-turn appends: response, then observation turns with new images / videos
    turn_media.py           an appended turn's images and videos, encoded and their pads expanded
    multiturn_batch.py      `MultiTurnBatch`: B conversations in one agent loop
    tool_calls.py           parse <tool_call> blocks, run tools, tool results -> a tool turn
    agent.py                `AgentLoop`: generate, call tools, append text + images, until done
    packers.py              cosmos-rl style `DataPacker` s (dataset item -> rollout -> policy batch)

Placeholder collapse/expand (training ids <-> one pad per image) is the encoding stage's
(`mmpipe.encoding`). The records these steps speak (`Generation`, `Completion`, `SamplingParams`, `RolloutSample`,
`Conversation`) live in `mmpipe.records`; multi-agent (ReMA) rollouts are `mmpipe.rema`.

    prompts = to_vllm_prompts(rows, processor)                 # inputs
    gens = VLLMEngine(llm, processor=processor).generate(rows) # engine
    samples = unbatch_rollout(rows, gens)                      # results
"""

from mmpipe.rollout.data_parallel import pad_to_multiple, trim
from mmpipe.rollout.images import row_images, row_video_frames, vision_spec_for, vllm_processor_kwargs
from mmpipe.rollout.inputs import as_rows, to_generate_kwargs, to_vllm_prompts
from mmpipe.rollout.videos import video_fps_for, vllm_video_prompt
from mmpipe.rollout.multiturn import (
    Conversation,
    append_messages,
    append_observation,
    append_response,
    conversation_encoder,
    start,
)
from mmpipe.rollout.multiturn_batch import MultiTurnBatch
from mmpipe.rollout.agent import AgentLoop, logprob_gaps, policy_logprobs_of, run_agent
from mmpipe.rollout.tool_calls import parse_qwen_tool_calls
from mmpipe.rollout.results import rollout_rows, unbatch_rollout
from mmpipe.rollout.transformers_engine import TransformersEngine, teacher_forced_logprobs
from mmpipe.rollout.vllm_engine import VLLMEngine, generation_from_request_output
from mmpipe.rollout.async_engine import AsyncTransformersEngine, AsyncVLLMEngine, ThreadedEngine, run_sync
from mmpipe.rollout.openai_engine import OpenAIEngine

__all__ = [
    "to_vllm_prompts", "to_generate_kwargs", "as_rows", "row_images", "row_video_frames", "vision_spec_for", "vllm_processor_kwargs",
    "vllm_video_prompt", "video_fps_for",
    "pad_to_multiple", "trim", "TransformersEngine", "teacher_forced_logprobs", "VLLMEngine",
    "generation_from_request_output", "unbatch_rollout", "rollout_rows", "Conversation", "start", "conversation_encoder",
    "append_response", "append_observation", "append_messages", "MultiTurnBatch", "DataPacker",
    "DecoderOnlyLLMDataPacker", "QwenVLDataPacker", "AgentLoop", "run_agent", "logprob_gaps", "policy_logprobs_of",
    "parse_qwen_tool_calls", "ThreadedEngine", "AsyncTransformersEngine", "AsyncVLLMEngine", "run_sync", "OpenAIEngine",
]


_PACKERS = ("DataPacker", "DecoderOnlyLLMDataPacker", "QwenVLDataPacker")


def __getattr__(name: str):
    # the packers subclass cosmos-rl's BaseDataPacker when it is installed, resolved on first use
    if name in _PACKERS:
        from mmpipe.rollout import packers

        return getattr(packers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
