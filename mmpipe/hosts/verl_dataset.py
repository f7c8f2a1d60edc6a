"""``MMPipeRLHFDataset`` (`mmpipe.hosts.verl`, built on first access): verl 0.9's ``RLHFDataset``
reading mmpipe-encoded rows (each item `verl_prompt_rows` of its row, the overlong filter on the
stored ``input_ids`` plus the tool schemas verl renders into each prompt) and raw rows (images opened
without ``qwen_vl_utils``; videos handed to verl's own video path, never dropped)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["make_dataset_class"]


def _video_items(messages) -> int:
    """How many ``{"type": "video"}`` items the messages hold (verl's ``_build_messages`` writes one
    per ``<video>``)."""
    return sum(1 for m in messages if isinstance(m, Mapping) and isinstance(m.get("content"), list)
               for item in m["content"] if isinstance(item, Mapping) and item.get("type") == "video")


def _qwen_vl_utils_needed(messages):
    """Context: verl's own video path imports ``qwen_vl_utils`` (verl does not install it); its
    absence becomes an `InputError` naming the fix. Why: the image hook alone returned no videos
    for these rows, so the prompt kept a ``<|video_pad|>`` with no frames (the model never saw the
    video) and verl's length filter counted the row as text."""
    import contextlib

    from mmpipe.errors import InputError

    @contextlib.contextmanager
    def ctx():
        try:
            yield
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] != "qwen_vl_utils":
                raise
            raise InputError("MMPipeRLHFDataset hands video items to verl's own video path", column="raw_prompt",
                             stage="rollout", where="", expected="qwen_vl_utils importable (verl reads videos with it)",
                             found=f"{_video_items(messages)} video item(s) and no qwen_vl_utils",
                             fix="pip install qwen-vl-utils, or drop the video rows") from e
    return ctx()


def _record_columns() -> set:
    from mmpipe.records.columns import ERROR_COLUMN, OPTIONAL_ROW_COLUMNS, ROW_COLUMNS

    return {n for n, _, _ in ROW_COLUMNS} | set(OPTIONAL_ROW_COLUMNS) | {ERROR_COLUMN}


def _encoded(dataframe) -> bool:
    """A ``datasets.Dataset`` of mmpipe-encoded rows (what ``encode_dataset`` writes)."""
    return dataframe is not None and {"input_ids", "family"} <= set(dataframe.column_names)


def make_dataset_class(verl_prompt_rows, verl_images_from_messages) -> type:
    """``MMPipeRLHFDataset``: verl's ``RLHFDataset`` (imported here; `ImportError` naming the fix
    without verl) with mmpipe's prompt rows and image hook (`mmpipe.hosts.verl.verl_prompt_rows`,
    `mmpipe.hosts.verl.verl_images_from_messages`, handed in: this module does not import that one)."""
    try:
        from verl.utils.dataset.rl_dataset import RLHFDataset
    except ImportError as e:
        raise ImportError(f"MMPipeRLHFDataset subclasses verl's RLHFDataset, and verl does not import here ({e}); "
                          "fix: install verl (scripts/envs/verl.sh builds .venv-verl)") from e

    class MMPipeRLHFDataset(RLHFDataset):
        """verl's ``RLHFDataset`` whose agent-loop hook takes the images as the rows hold them
        (`verl_prompt_rows`'s mmpipe-resized PIL images), without ``qwen_vl_utils``. Its
        ``data_files`` may hold mmpipe-ENCODED rows (``encode_dataset(...).to_parquet(path)``,
        the prompt column kept): each item is then `verl_prompt_rows` of the row (every column
        that is not a record column passes through), and ``filter_overlong_prompts`` keeps the
        rows whose ``input_ids`` fit ``max_prompt_length``; rows that failed to encode under
        ``on_error="skip"`` are an `InputError` naming them when the files are read (drop them with
        ``mmpipe.drop_failed`` first). Raw rows go verl's own way; their images
        are opened without ``qwen_vl_utils``, their videos go to verl's own (``qwen_vl_utils``) path."""

        def maybe_filter_out_long_prompts(self, dataframe=None):
            if not _encoded(dataframe):
                return super().maybe_filter_out_long_prompts(dataframe)
            from mmpipe.batching.checks import check_dataset_not_failed

            # failed rows (0 ids) pass every length filter: refused now, not when verl's loop reaches them
            check_dataset_not_failed(dataframe, "MMPipeRLHFDataset", stage="rollout")
            if not self.filter_overlong_prompts:
                return dataframe
            n = self.max_prompt_length
            if not getattr(self, "tool_schemas", None) or self.prompt_key not in dataframe.column_names:
                return dataframe.filter(lambda ids: len(ids) <= n, input_columns="input_ids", desc=f"input_ids <= {n}")
            # verl's filter renders the tool schemas into each prompt (the agent loop does): count them too
            return dataframe.filter(lambda ids, prompt: len(ids) + self._tool_tokens(prompt) <= n,
                                    input_columns=["input_ids", self.prompt_key], desc=f"input_ids + tools <= {n}")

        def _tool_tokens(self, prompt) -> int:
            """The tokens ``data.tool_config_path`` / ``function_tool_path``'s schemas add to this
            prompt as the chat template renders it (verl's filter and agent loop pass them as
            ``tools``); stored ``input_ids`` do not hold them. Text-only renderings: the image
            items render the same with and without tools."""
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            tok = getattr(self.processor, "tokenizer", None) or self.tokenizer
            render = self.processor if self.processor is not None else self.tokenizer
            kw = dict(self.apply_chat_template_kwargs or {})
            texts = [render.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra, **kw)
                     for extra in ({"tools": self.tool_schemas}, {})]
            with_tools, without = (len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
            return with_tools - without

        def __getitem__(self, item):
            if not _encoded(self.dataframe):
                return super().__getitem__(item)
            keep = [c for c in self.dataframe.column_names if c not in _record_columns()]
            return verl_prompt_rows([self.dataframe[item]], self.processor, prompt_key=self.prompt_key,
                                    keep_columns=keep)[0]

        @classmethod
        def _process_multi_modal_info(cls, messages, image_patch_size=14, config=None):
            if _video_items(messages):  # verl's own video path (qwen_vl_utils): never drop a video
                with _qwen_vl_utils_needed(messages):
                    return super()._process_multi_modal_info(messages, image_patch_size, config)
            return verl_images_from_messages(messages), None, cls._extract_audio_info(messages) or None

        @classmethod
        async def process_vision_info(cls, messages, image_patch_size=14, config=None):
            if _video_items(messages):
                with _qwen_vl_utils_needed(messages):
                    return await super().process_vision_info(messages, image_patch_size, config)
            return verl_images_from_messages(messages), None

    MMPipeRLHFDataset.__module__, MMPipeRLHFDataset.__qualname__ = "mmpipe.hosts.verl", "MMPipeRLHFDataset"
    return MMPipeRLHFDataset
