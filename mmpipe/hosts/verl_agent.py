"""verl: a VRAG-style multi-turn agent loop (tools that return images) whose tokens, images and
positions are mmpipe's, plugged into verl 0.9's agent-loop machinery.

::

    import mmpipe.hosts.verl_agent as mmagent
    path = mmagent.write_agent_loop_config("agent_loops.yaml")   # verl's agent_loop_config_path file
    # verl config:
    #   actor_rollout_ref.rollout.agent.agent_loop_config_path=<path>
    #   actor_rollout_ref.rollout.agent.default_agent_loop=mmpipe_tool_agent   (or an agent_name column)
    #   actor_rollout_ref.rollout.multi_turn.{format=hermes, tool_config_path | function_tool_path}
    #   data.custom_cls.path=<mmpipe.hosts.verl file>  data.custom_cls.name=MMPipeRLHFDataset

`MMPipeToolAgentLoop` is verl's ``ToolAgentLoop`` (same config, tools, tool parser, tool calls:
``BaseTool`` / ``@function_tool`` tools returning ``ToolResponse(image=[...], text=...)``) with
its token bookkeeping done by mmpipe instead of verl's continuous-token builder:

- the prompt (``raw_prompt``, images inline as `verl_prompt_rows` writes them) is encoded by
  `mmpipe.rollout.multiturn.start`;
- each reply is appended as generated (`append_response`: never re-tokenized; response mask 1
  on the sampled tokens, 0 on the end-of-turn text the template adds);
- the tool results go back as ONE turn (`append_messages`, the template's tool role), their
  images resized and encoded by mmpipe (grids, pixels, positions continued), response mask 0;
- every ``server_manager.generate`` call gets mmpipe's expanded ids and ALL the row's images
  so far as mmpipe resized them (`mmpipe.rollout.row_images`), so a vLLM / SGLang server
  re-processes them to the same grids; ``multi_modal_data["images"]`` holds the same images,
  so verl's ``_agent_loop_postprocess`` rebuilds mmpipe's ``pixel_values`` / ``image_grid_thw``
  and its ``get_rope_index`` gives mmpipe's M-RoPE positions (checked in
  ``tests/hosts/test_verl_vrag.py``).

Ends: a reply without a tool call; ``multi_turn.max_assistant_turns`` / ``max_user_turns``;
the response budget (``rollout.response_length``): a reply gets ``max_tokens`` = the room left,
and a tool turn that would not fit whole is not appended (an image is never cut); a sampled
vision token (the reply is cut before it: an image slot with no image). A prompt longer than
``rollout.prompt_length`` (template and tool schemas included) raises `mmpipe.errors.TruncationError`
(verl pads prompts to that width without cutting them). Image rows of the
Qwen-VL families (mmpipe's multi-turn support); videos from tools are refused.
verl is imported only when the class is built (first attribute access).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from mmpipe.errors import ArgumentError

__all__ = ["AGENT_NAME", "write_agent_loop_config", "split_inline_images"]
HOST_CLASSES = ("MMPipeToolAgentLoop",)  # built from verl's own classes on first access (ImportError without verl)

AGENT_NAME = "mmpipe_tool_agent"
_ROOM = 3  # the least room a reply needs: one token and the template's end of turn
_CACHE_ATTR = "_mmpipe_agent_encoders"  # on the processor: its encoders, freed with it (`_encoder`)


def write_agent_loop_config(path) -> str:
    """Write verl's ``agent_loop_config_path`` YAML registering `MMPipeToolAgentLoop` as
    ``mmpipe_tool_agent`` (``AgentLoopWorker`` loads it and ``hydra`` builds the class by name).
    Returns the absolute path as a string."""
    Path(path).write_text(f"- name: {AGENT_NAME}\n  _target_: {__name__}.MMPipeToolAgentLoop\n")
    return str(Path(path).resolve())


def split_inline_images(messages) -> tuple[list[dict], list]:
    """verl messages with inline ``{"type": "image", "image": img}`` items -> (messages with
    ``{"type": "image"}`` placeholders, the images in order): what `mmpipe.encode` takes."""
    out, images = [], []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):
            parts = []
            for item in m["content"]:
                if isinstance(item, dict) and item.get("type") == "image":
                    if item.get("image") is None:
                        raise ArgumentError("a raw_prompt image item has no 'image'; expected the PIL image inline, as "
                                            "verl_prompt_rows writes it; fix: build the rows with verl_prompt_rows")
                    images.append(item["image"])
                    item = {"type": "image"}
                parts.append(item)
            m["content"] = parts
        out.append(m)
    return out, images


def _check_prompt_length(n: int, prompt_length: int, kwargs: dict, has_images: bool) -> None:
    """Refuse a prompt of ``n`` tokens (template, tool schemas and image tokens included) longer
    than ``rollout.prompt_length`` with a `TruncationError` naming the row (``index``, as verl's
    dataset derives it from ``extra_info``). Why: verl's ``_agent_loop_postprocess`` pads the
    prompt to ``prompt_length`` without cutting it, so a longer one either breaks the batch's
    ``torch.cat`` (``Sizes of tensors must match``) or silently widens ``prompts`` past
    ``prompt_length``. verl's own loops refuse a multimodal prompt here too and left-truncate a
    text one; mmpipe never cuts a prompt (its start is the system turn and the tool schemas)."""
    if n <= prompt_length:
        return
    from mmpipe.errors import TruncationError

    raise TruncationError(
        "the agent loop's prompt (chat template" + (", image tokens" if has_images else "") + " and tool schemas "
        "included) does not fit rollout.prompt_length", row=kwargs.get("index"), column="raw_prompt",
        stage="rollout", expected=f"at most rollout.prompt_length={prompt_length} tokens", found=f"{n} tokens",
        fix="raise actor_rollout_ref.rollout.prompt_length (and data.max_prompt_length), or drop such rows before "
            "training (data.filter_overlong_prompts=true; with tools, count the tool schemas' tokens too)")


def _encoder(processor, chat_template_kwargs=None, mm_processor_kwargs=None):
    """One mmpipe `Encoder` per processor and settings (agent loops are built per sample), with
    what verl's own loops render and process with: ``chat_template_kwargs`` is verl's
    ``data.apply_chat_template_kwargs`` (``enable_thinking``, ``add_vision_id`` ...) and
    ``mm_processor_kwargs`` its ``data.mm_processor_kwargs`` (image bounds, `_pixel_bounds`)."""
    from mmpipe.rollout.multiturn import conversation_encoder

    kwargs = _plain(chat_template_kwargs or {})  # an OmegaConf DictConfig from verl's config
    options = {"chat_template_kwargs": kwargs} if kwargs else {}
    options.update(_pixel_bounds(_plain(mm_processor_kwargs or {})))
    key = repr(sorted(options.items()))
    # cached ON the processor: an Encoder holds its processor, so a module dict (even one with weak
    # keys: the value would hold the key) kept every processor and its encoders alive for the process
    cache = _encoder_cache(processor)
    enc = cache.get(key)
    if enc is None:
        enc = cache[key] = conversation_encoder(processor, options)
    return enc


class _ProcessorEncoders(dict):
    """The encoders `_encoder` built for one processor, by settings, kept in the processor's own
    ``__dict__``: they live as long as it does (the processor -> encoder -> processor cycle is
    collected with it). Deep copies and pickles of the processor get an empty one
    (``ProcessorMixin.to_dict`` deep-copies the processor's ``__dict__``)."""

    def __deepcopy__(self, memo) -> "_ProcessorEncoders":
        return _ProcessorEncoders()

    def __reduce__(self):
        return _ProcessorEncoders, ()


def _encoder_cache(processor) -> dict:
    """``processor``'s `_ProcessorEncoders` (made on first use); a fresh dict (no caching) for an
    object without a ``__dict__``."""
    own = getattr(processor, "__dict__", None)
    if not isinstance(own, dict):
        return {}
    cache = own.get(_CACHE_ATTR)
    if not isinstance(cache, _ProcessorEncoders):
        cache = own[_CACHE_ATTR] = _ProcessorEncoders()
    return cache


_VIDEO_KEYS = ("fps", "num_frames", "do_sample_frames", "videos_kwargs")  # the loop takes no videos (refused there)


def _pixel_bounds(mm: dict) -> dict:
    """verl's ``mm_processor_kwargs`` (the processor call's keywords for every image of the loop) as
    the `Encoder`'s ``min_pixels`` / ``max_pixels``: top level or in ``images_kwargs``, as the pixel
    counts or as ``size`` ``{"shortest_edge", "longest_edge"}``. Another image keyword would make
    verl's images differ from mmpipe's: `ArgumentError`."""
    flat = {**{k: v for k, v in mm.items() if k != "images_kwargs"}, **(mm.get("images_kwargs") or {})}
    size = flat.pop("size", None) or {}
    bounds = {"min_pixels": flat.pop("min_pixels", size.get("shortest_edge")),
              "max_pixels": flat.pop("max_pixels", size.get("longest_edge"))}
    other = sorted(k for k in flat if k not in _VIDEO_KEYS)
    if other or set(size) - {"shortest_edge", "longest_edge"}:
        raise ArgumentError(f"data.mm_processor_kwargs {other or sorted(size)} are not taken by MMPipeToolAgentLoop: "
                            "it processes images with the processor's settings and the pixel bounds min_pixels / "
                            "max_pixels (or size shortest_edge / longest_edge) only; set the others on the "
                            "checkpoint's image processor (preprocessor_config.json)")
    return {k: v for k, v in bounds.items() if v is not None}


def _plain(value):
    """dicts and lists of a config value (OmegaConf's DictConfig / ListConfig) as plain ones."""
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _make_class():
    try:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
        from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
    except ImportError as e:
        raise ImportError(f"MMPipeToolAgentLoop subclasses verl's ToolAgentLoop, and verl does not import here ({e}); "
                          "fix: install verl (scripts/envs/verl.sh builds .venv-verl)") from e
    from mmpipe.rollout.images import row_images, vision_spec_for
    from mmpipe.rollout.multiturn import append_messages, append_response, start
    from mmpipe.rollout.tool_calls import tool_result_content, tool_role_of

    class MMPipeToolAgentLoop(ToolAgentLoop):
        """verl's ``ToolAgentLoop`` with mmpipe's multi-turn rows (see the module docstring)."""

        async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
            enc = _encoder(self.processor, self.apply_chat_template_kwargs, self.mm_processor_kwargs)
            spec = vision_spec_for(self.processor, enc.family)
            messages, images = split_inline_images(kwargs["raw_prompt"])
            data = self._agent_data(kwargs, priority)
            raw = {"messages": messages, "images": images}
            if data._active_tool_schemas:
                raw["tools"] = data._active_tool_schemas
            conv = start(raw, enc)
            _check_prompt_length(conv.num_tokens, self.rollout_config.prompt_length, kwargs, bool(images))
            n_prompt, mask, lps, state = conv.num_tokens, [], [], {"lp": False}
            while True:
                room = n_prompt + self.response_length - conv.num_tokens
                if room < _ROOM:
                    break
                conv, ids, cut = await self._reply(conv, spec, sampling_params, room, data, mask, lps, state)
                if cut or len(mask) >= self.response_length:
                    break
                if self.max_assistant_turns and data.assistant_turns >= self.max_assistant_turns:
                    break
                if self.max_user_turns and data.user_turns >= self.max_user_turns:
                    break
                tools = [t.tool_schema for t in data._active_tools.values()]
                _, data.tool_calls = await self.tool_parser.extract_tool_calls(ids, tools)
                if not data.tool_calls:
                    break
                nxt = await self._tool_turn(conv, data, enc, append_messages, tool_result_content, tool_role_of)
                if nxt.num_tokens - n_prompt + _ROOM > self.response_length:
                    break  # the tool turn does not fit whole: never cut an image
                mask += [0] * (nxt.num_tokens - conv.num_tokens)
                lps += [0.0] * (nxt.num_tokens - conv.num_tokens)
                conv, data.user_turns = nxt, data.user_turns + 1
            ids = conv.row.input_ids.tolist()
            out = AgentLoopOutput(
                prompt_ids=ids[:n_prompt], response_ids=ids[n_prompt:][: self.response_length],
                response_mask=mask[: self.response_length],
                response_logprobs=lps[: self.response_length] if state["lp"] else None,
                multi_modal_data={"images": row_images(conv.row, spec)} if conv.row.num_images else {},
                num_turns=data.user_turns + data.assistant_turns + 1, metrics=data.metrics,
                extra_fields=data.extra_fields)
            out.extra_fields.update({"turn_scores": data.turn_scores, "tool_rewards": data.tool_rewards})
            return out

        def _agent_data(self, kwargs, priority):
            data = AgentData(messages=list(kwargs["raw_prompt"]), image_data=None, video_data=None, audio_data=None,
                             mm_processor_kwargs=None, metrics={},
                             request_id=self._make_request_id(priority, self.rollout_config.full_determinism),
                             tools_kwargs=kwargs.get("tools_kwargs", {}) or {})
            selection = (kwargs.get("extra_info") or {}).get("tool_selection")  # as ToolAgentLoop.run
            if selection and self.tools:
                data._active_tools = {n: self.tools[n] for n in selection if n in self.tools}
                data._active_tool_schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
                                             for t in data._active_tools.values()]
            else:
                data._active_tools, data._active_tool_schemas = self.tools, self.tool_schemas
            return data

        async def _reply(self, conv, spec, sampling_params, room, data, mask, lps, state):
            """One generate call on the row so far; the reply appended (cut before a vision token)."""
            params = dict(sampling_params, max_tokens=min(room - _ROOM + 1, sampling_params.get("max_tokens", room)))
            if self.tool_parser.stop_token_ids:
                params["stop_token_ids"] = list(set((params.get("stop_token_ids") or []) + self.tool_parser.stop_token_ids))
            out = await self.server_manager.generate(
                request_id=data.request_id, prompt_ids=conv.row.input_ids.tolist(), sampling_params=params,
                image_data=row_images(conv.row, spec) or None, video_data=None)
            data.assistant_turns += 1
            ids = list(out.token_ids)
            vision = [v for v in conv.encoder.family.vision_token_ids(conv.encoder.tokenizer).values() if v is not None]
            hit = np.flatnonzero(np.isin(np.asarray(ids, dtype=np.int64), vision))
            cut = bool(len(hit))
            ids = ids[: hit[0]] if cut else ids
            before = conv.num_tokens
            conv = append_response(conv, ids)
            added = conv.num_tokens - before - len(ids)
            mask += [1] * len(ids) + [0] * added
            state["lp"] = state["lp"] or bool(out.log_probs)
            lps += list(out.log_probs or [0.0] * len(ids))[: len(ids)] + [0.0] * added
            return conv, ids, cut

        async def _tool_turn(self, conv, data, enc, append_messages, tool_result_content, tool_role_of):
            """Run the parsed calls (verl's ``_call_tool``) and append their results as one turn."""
            from mmpipe.images.load import load_image

            calls = data.tool_calls[: self.max_parallel_calls]
            results = await asyncio.gather(*(self._call_tool(c, data.tools_kwargs, data) for c in calls))
            role, msgs, images = tool_role_of(enc), [], []
            for resp, reward, _ in results:
                if resp.video:
                    raise ArgumentError("a tool returned a video; MMPipeToolAgentLoop takes image results (as verl's "
                                        "ToolAgentLoop); fix: return frames as images")
                # every image item is opened here: a path string would otherwise go in as the turn's TEXT
                # (tool_result_content reads str items as text) and the model would never see the page
                items = [load_image(im, where=f"tool result image {k}")
                         for k, im in enumerate(resp.image or []) if im is not None] + ([resp.text] if resp.text else [])
                content, imgs = tool_result_content(items)
                if role == "user":
                    content = ([{"type": "text", "text": "<tool_response>\n"}] + (content if isinstance(content, list) else
                               [{"type": "text", "text": content}]) + [{"type": "text", "text": "\n</tool_response>"}])
                msgs.append({"role": role, "content": content})
                images += imgs
                if reward is not None:
                    data.tool_rewards.append(reward)
            return append_messages(conv, msgs, images)

    MMPipeToolAgentLoop.__module__, MMPipeToolAgentLoop.__qualname__ = __name__, "MMPipeToolAgentLoop"
    return MMPipeToolAgentLoop


def __getattr__(name: str):
    if name == "MMPipeToolAgentLoop":
        cls = _make_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
