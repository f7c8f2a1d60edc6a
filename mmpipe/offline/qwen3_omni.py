"""Offline fixtures for Qwen3-Omni-MoE's thinker (transformers ``qwen3_omni_moe``): images and audio
on the generic path, in the main environment (the video processor needs torchvision, so these
processors take no videos here; ``build_processor(videos=True)`` has it, in the vision and vLLM
environments). ``save_checkpoint`` writes a tiny checkpoint vLLM serves (``Qwen3OmniMoeForConditionalGeneration``: its
thinker), with the published weight names and per-expert layout.

Published facts written into the builders:

- ``Qwen3OmniMoeProcessor`` around ``Qwen2VLImageProcessor`` with Qwen3-VL's vision settings
  (patch 16, merge 2, temporal patch 2, mean / std 0.5) and ``WhisperFeatureExtractor`` (128 mel
  bins, 16 kHz, hop 160, ``chunk_length`` 300 s as the checkpoint's ``preprocessor_config.json``
  sets it: transformers' own processor test lowers it from "the default 300s" to 30);
- the processor's audio defaults (transformers 5.24): ``padding=True`` (each call pads its clips
  to the LONGEST of them, not to a fixed window: ``input_features`` [A, 128, longest frames],
  ``feature_attention_mask`` [A, longest frames]) and ``truncation=False`` (nothing is cut);
  audio tokens per clip ``_get_feat_extract_output_lengths(frames, n_window=50)``: 13 per full
  100-frame chunk plus, for the remaining r frames, ``((f - 1) // 2 + 1 - 1) // 2 + 1`` with
  ``f = (r - 1) // 2 + 1`` (three stride-2 convolutions);
- the checkpoint's special tokens: ``<|audio_start|><|audio_pad|><|audio_end|>`` per clip,
  ``<|vision_start|><|image_pad|><|vision_end|>`` per image (ids 151669 / 151675 / 151670 and
  151652 / 151655 / 151653 in the real vocabulary; here the offline BPE's ids);
- no default system turn (transformers' integration test decodes the rendered prompt as
  ``user\\n<audio><image>What's ...``; ms-swift registers the template with ``default_system=None``);
- the thinker: a Qwen3-MoE text model (48 layers, 128 experts, 8 active, 32 query / 4 KV heads in
  the checkpoint) with interleaved M-RoPE (``mrope_section`` [24, 20, 20] over head_dim / 2 = 64);
  TMRoPE positions from the model's own ``get_rope_index``: one per audio token (13 a second),
  video frames at ``position_id_per_seconds`` (13, the processor's default; the config class says
  25); its audio encoder selects the frames of ``feature_attention_mask`` before convolving, so
  padded frames never reach it.

The chat template (`QWEN3_OMNI_CHAT_TEMPLATE`) is NOT the verbatim ``chat_template.json`` of
Qwen/Qwen3-Omni-30B-A3B-Instruct: that text was not found in the searchable sources. It is the
published Qwen3 template (the hybrid-thinking Qwen3 checkpoints' revision with ``message.content is
string``, as copied in public Qwen3 fine-tuning code: tools block, the last-query
rule ``message.role == "user" and message.content is string and not(<tool_response>...)`` -- the
rule a public bug report quotes from the Omni template, sujitnoronha/audio_reasoning_interspeech
docs/QWEN3_OMNI_CHAT_TEMPLATE_BUG_REPORT.md --, the reasoning split, tool calls and
responses) with three changes: a list content is rendered item by item into the turn's text
(``<|audio_start|><|audio_pad|><|audio_end|>`` per audio item, the Qwen3-VL vision spans per
image / video, text as it is), the first system message is rendered from that text (so a list
system content works, as the Omni one does), and the generation prompt has no ``enable_thinking``
switch. Like the Omni template (the bug report), it renders a reply's ``<think>`` part away unless
the reply follows the last STRING user query, and writes an empty ``<think>`` block into the last
reply after a string query; it renders that report's conversation as the report's actual output
(tests/encoding/test_qwen3_omni.py).
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.qwen_omni import no_video_class
from mmpipe.offline.tf_lines import classes_by_name, pil_image_processor, rope_config_fields
from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["QWEN3_OMNI_CHAT_TEMPLATE", "QWEN3_OMNI_TOKENS", "build_processor", "build_model"]

QWEN3_OMNI_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                     "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<|audio_start|>", "<|audio_end|>",
                     "<|audio_pad|>")
_NAMED = dict(image_token="<|image_pad|>", audio_token="<|audio_pad|>", video_token="<|video_pad|>",
              vision_bos_token="<|vision_start|>", vision_eos_token="<|vision_end|>",
              audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>")

# The published Qwen3 template with the Omni media items of a list content (see the module doc).
QWEN3_OMNI_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set parts = namespace(text='') %}
        {%- for item in message.content %}
            {%- if item.type == 'audio' or 'audio' in item or 'audio_url' in item %}
                {%- set parts.text = parts.text + '<|audio_start|><|audio_pad|><|audio_end|>' %}
            {%- elif item.type == 'image' or 'image' in item or 'image_url' in item %}
                {%- set parts.text = parts.text + '<|vision_start|><|image_pad|><|vision_end|>' %}
            {%- elif item.type == 'video' or 'video' in item %}
                {%- set parts.text = parts.text + '<|vision_start|><|video_pad|><|vision_end|>' %}
            {%- elif 'text' in item %}
                {%- set parts.text = parts.text + item.text %}
            {%- endif %}
        {%- endfor %}
        {%- set content = parts.text %}
    {%- endif %}
    {%- if message.role == "system" and loop.first %}
        {%- if not tools %}
            {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif (message.role == "user") or (message.role == "system") %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
MIN_PIXELS, MAX_PIXELS = 64 * 64, 128 * 128  # tiny: 4..16 merged tokens per image (patch 16, merge 2)
CHUNK_LENGTH = 300  # seconds: the checkpoint's preprocessor_config.json (n_samples 4,800,000)


@functools.lru_cache(maxsize=None)
def _tokenizer():
    return offline_tokenizer(QWEN3_OMNI_TOKENS, eos="<|im_end|>", pad="<|endoftext|>", named=_NAMED,
                             template=QWEN3_OMNI_CHAT_TEMPLATE)


def build_processor(videos: bool = False):
    """The stock ``Qwen3OmniMoeProcessor``: the PIL ``Qwen2VLImageProcessor`` at Qwen3-Omni's
    vision settings and tiny pixel bounds, the ``WhisperFeatureExtractor`` as published (128 mel
    bins, 300 s chunk), the offline tokenizer with the checkpoint's special tokens and
    `QWEN3_OMNI_CHAT_TEMPLATE`; a fresh object. No video processor unless ``videos`` (then the
    stock class with ``Qwen2VLVideoProcessor`` at the same vision settings: torchvision needed,
    the vision / vLLM environments only)."""
    import transformers

    vision = dict(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=16, merge_size=2, temporal_patch_size=2,
                  image_mean=[0.5] * 3, image_std=[0.5] * 3)
    ip = pil_image_processor("Qwen2VLImageProcessorPil")(**vision)
    fe = transformers.WhisperFeatureExtractor(feature_size=128, chunk_length=CHUNK_LENGTH)
    if videos:
        return transformers.Qwen3OmniMoeProcessor(image_processor=ip,
                                                  video_processor=transformers.Qwen2VLVideoProcessor(**vision),
                                                  feature_extractor=fe, tokenizer=copy.deepcopy(_tokenizer()),
                                                  chat_template=QWEN3_OMNI_CHAT_TEMPLATE)
    return _class()(image_processor=ip, feature_extractor=fe, tokenizer=copy.deepcopy(_tokenizer()),
                    chat_template=QWEN3_OMNI_CHAT_TEMPLATE)


@functools.lru_cache(maxsize=None)
def _class() -> type:
    """``Qwen3OmniMoeProcessor`` without its video processor (whose class check needs torchvision):
    ``ProcessorMixin`` takes the sub-processors from the ``__init__`` signature; the stock class
    stays in the MRO (`mmpipe.families.processor_class_name`). ``model_input_names`` reads the
    video processor's: here the other sub-processors' and the stock extra names."""
    import transformers

    @property
    def model_input_names(self):
        names = (self.tokenizer.model_input_names + self.feature_extractor.model_input_names
                 + self.image_processor.model_input_names + ["feature_attention_mask", "video_second_per_grid"])
        return list(dict.fromkeys(names))

    return no_video_class(transformers.Qwen3OmniMoeProcessor, {"model_input_names": model_input_names},
                          module=__name__)


# the class pickles by name (spawn DataLoader workers, pickled encoders)
__getattr__ = classes_by_name(__name__, lambda name: _class() if name == "NoVideoQwen3OmniMoeProcessor" else None)


def build_model(head_dim: int = 16):
    """A tiny ``Qwen3OmniMoeThinkerForConditionalGeneration``: text hidden 64 (4 heads of 16,
    interleaved ``mrope_section`` [4, 2, 2]), 2 MoE layers of 4 experts (2 per token, 32 wide);
    vision depth 2 (patch 16, merge 2, deepstack at layer 0, out 64); audio encoder 2 layers of
    width 32 (128 mel bins, ``n_window`` 50, downsample 16, output 64); fp32, eager attention.
    ``head_dim`` 64: hidden 128 (2 heads of 64, ``mrope_section`` [12, 10, 10]), for vLLM's CPU attention."""
    import torch
    import transformers

    tok = _tokenizer()
    audio_id, image_id, video_id, a_bos, a_eos, v_bos, v_eos = ids(
        tok, "<|audio_pad|>", "<|image_pad|>", "<|video_pad|>", "<|audio_start|>", "<|audio_end|>",
        "<|vision_start|>", "<|vision_end|>")
    # interleaved M-RoPE over head_dim / 2 = 8 frequencies: H takes 1, 4; W takes 2, 5; T the other 4
    # (the checkpoint: [24, 20, 20] over 64)
    heads = 4 if head_dim == 16 else 2
    width = heads * head_dim
    section = [4, 2, 2] if head_dim == 16 else [12 * head_dim // 64, 10 * head_dim // 64, 10 * head_dim // 64]
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": section, "interleaved": True,
            "mrope_interleaved": True}
    text = dict(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096,
                **rope_config_fields(rope), moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                decoder_sparse_step=1, norm_topk_prob=True, pad_token_id=tok.pad_token_id)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=width, num_position_embeddings=64,
                  deepstack_visual_indexes=[0])
    audio = dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128,
                 output_dim=width, n_window=50, n_window_infer=400, max_source_positions=1500,
                 downsample_hidden_size=16, conv_chunksize=500)
    cfg = transformers.Qwen3OmniMoeThinkerConfig(
        text_config=text, vision_config=vision, audio_config=audio, audio_token_id=audio_id,
        image_token_id=image_id, video_token_id=video_id, audio_start_token_id=a_bos,
        position_id_per_seconds=13)  # the processor's default (the config class says 25)
    for name, value in (("audio_end_token_id", a_eos), ("vision_start_token_id", v_bos),
                        ("vision_end_token_id", v_eos)):
        setattr(cfg, name, value)  # read by get_rope_index; not declared fields of the strict config
    return transformers.Qwen3OmniMoeThinkerForConditionalGeneration._from_config(
        cfg, attn_implementation="eager", dtype=torch.float32).eval()


def checkpoint_model(seed: int = 0):
    """The thinker `save_checkpoint` saves: `build_model` at ``head_dim`` 64, seeded with ``seed``."""
    from mmpipe.offline.seeded import seeded

    return seeded(int(seed), build_model, head_dim=64)


def published_weights(model) -> dict:
    """The thinker's weights as the published checkpoint names and lays them out (what vLLM loads):
    ``thinker.`` + ``audio_tower.`` / ``visual.`` / ``model.`` / ``lm_head.``, and each fused expert tensor
    (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]) split per expert into
    ``experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj`` ``.weight``."""
    out = {}
    for name, v in model.state_dict().items():
        for ours, published in (("model.audio_tower.", "audio_tower."), ("model.visual.", "visual."),
                                ("model.language_model.", "model."), ("audio_tower.", "audio_tower."),
                                ("visual.", "visual."), ("model.", "model."), ("lm_head.", "lm_head.")):
            if name.startswith(ours):
                name = "thinker." + published + name[len(ours):]
                break
        if name.endswith("experts.gate_up_proj"):
            half = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :half].contiguous()
                out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, half:].contiguous()
        elif name.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                out[name.replace("down_proj", f"{e}.down_proj.weight")] = v[e].contiguous()
        else:
            out[name] = v.contiguous()
    return out


def save_checkpoint(path, *, seed: int = 0):
    """A tiny Qwen3-Omni checkpoint for vLLM (``Qwen3OmniMoeForConditionalGeneration``, whose thinker
    it serves): `checkpoint_model` as `published_weights`, a ``Qwen3OmniMoeConfig`` with the
    thinker's config and no audio output, and the processor with its video processor
    (`build_processor` ``videos=True``: torchvision's Python part must import). Returns the path."""
    import json
    from pathlib import Path

    import transformers
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = checkpoint_model(seed)
    save_file(published_weights(model), str(path / "model.safetensors"), metadata={"format": "pt"})
    thinker = model.config.to_dict()
    cfg = transformers.Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False)
    cfg.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    cfg.save_pretrained(path)
    # vLLM reads two vision fields of the published config the config class does not declare: image_size (768
    # there: 48 x 48 patches of 16; here the grid of num_position_embeddings, 8 x 8, times the patch size) and
    # apply_vit_abs_pos_embed (true: the interpolated position embedding transformers always adds)
    written = json.loads((path / "config.json").read_text())
    vision = written["thinker_config"]["vision_config"]
    vision["image_size"] = int(round(vision["num_position_embeddings"] ** 0.5)) * vision["patch_size"]
    vision["apply_vit_abs_pos_embed"] = True
    written["thinker_config"]["text_config"]["tie_word_embeddings"] = False  # read by vLLM; the head is the thinker's own
    (path / "config.json").write_text(json.dumps(written, indent=2))
    tok = _tokenizer()
    gen = {"eos_token_id": [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id], "pad_token_id": tok.pad_token_id}
    (path / "generation_config.json").write_text(json.dumps(gen))
    build_processor(videos=True).save_pretrained(path)
    return path
