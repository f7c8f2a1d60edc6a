"""What a kind answers when its modules do not say otherwise (`mmpipe.media.strategy`): the answers
of a kind without the feature, written once instead of once per kind. A kind's own module
defines a name only where its answer differs (the patch grids' M-RoPE positions, the processor
kind's row checks...)."""

from __future__ import annotations

from typing import Any, Optional

from mmpipe.errors import ArgumentError

BATCH_ARRAYS = "numpy"  # the batch's fields stay numpy (as_torch / model_inputs convert)
POSITION_ROWS = ()  # position_ids [L] per row, [B, L] per batch
COLLATOR_NEEDS_PROCESSOR = None  # what a Collator cannot do without the processor (None: nothing)
DEVICE_PIXELS = False  # the batch holds its model's float pixels (no uint8 kept for `device_pixels`)
TAKES_AUDIO = False  # audio clips: the processor kind only (the Omni thinkers, Gemma 3n, Phi-4-multimodal)
TAKES_VIDEO_SOUND = False  # videos with their sound (use_audio_in_video): the processor kind only (the Omni thinkers)
CHECK_STORED_DTYPES = False  # cast on read, not refused (list<uint8> tiles come back int64 from torch-formatted datasets)
VIEW_SIZE_NOTE = False  # view labels show the size themselves
ROW_FIELDS = ()  # (record field, the batch's list of its per-row values): each row's own back at unbatch
CHOICE_NOTES: dict = {}  # option -> why the kind takes only some of its values (`mmpipe.encoding.options.kind_options`)
ROLLOUT_REFUSED: dict = {}  # rollout stage (`mmpipe.rollout.support.ROLLOUT_STAGES`) -> why it refuses the rows


def position_inputs(batch, positions) -> dict:
    """``position_ids`` [B, L] of a 1-D family: ``positions`` "1d" (the default) or "none" (the
    model computes them); anything else is an `ArgumentError`."""
    if (positions or "1d") not in ("1d", "none"):
        raise ArgumentError(f"positions must be '1d' or 'none' for {batch.family}, got {positions!r}")
    return {} if positions == "none" else {"position_ids": batch.position_ids}


def pack_token_types(fam, token_types) -> dict:
    """A pack's token types as the model takes them: none (handed over by ``model_inputs``, or the
    kind does not pack)."""
    return {}


def device_pixels(batch, device) -> dict:
    """Nothing to expand: the batch holds its float pixels (`DEVICE_PIXELS`)."""
    return {}


def dataset_checks(table, processor=None) -> list:
    """Nothing beyond the common checks (one family, the processor's family)."""
    return []


def row_checks(table, *, processor=None, images_kwargs: Optional[dict] = None, positions: bool = True):
    """None: reading a row checks all the kind can."""
    return None


def unbatch_media(batch, rows: list) -> list[dict]:
    """Each row's media fields: its layout fields and `ROW_FIELDS`, as unbatch cut them out
    (``rows``, `mmpipe.batching.unbatch`); nothing more."""
    return rows


def rollout_refusal(fam, stage: str) -> Optional[str]:
    """Why rollout ``stage`` (`mmpipe.rollout.support.ROLLOUT_STAGES`) cannot take the kind's rows,
    as the kind declares (``ROLLOUT_REFUSED``); None: the stage takes them."""
    return fam.media.ROLLOUT_REFUSED.get(stage)


def vllm_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[list] = None,
                index: int = 0, videos: Optional[list] = None, video_options: Any = None,
                audios: Optional[list] = None) -> dict:
    """Row ``r`` -> its vLLM prompt dict (`mmpipe.rollout.inputs.to_vllm_prompts`), in the prompt style
    the kind declares (``VLLM_PROMPT``: `mmpipe.rollout.vllm_prompts.STYLES`); ``audios``: the row's
    clips, for the ``processor`` style only (the Omni thinkers)."""
    from mmpipe.errors import ArgumentError
    from mmpipe.rollout.vllm_prompts import STYLES

    style = r.fam.media.VLLM_PROMPT
    extra = {}
    if audios is not None:
        if style != "processor":
            raise ArgumentError(f"audios= is for the Omni thinkers' rows (audio clips in the prompt); {r.family} "
                                "rows hold no audio: drop audios=")
        extra["audios"] = audios
    return STYLES[style](r, processor, tokenizer=tokenizer, images=images, index=index, videos=videos,
                         video_options=video_options, **extra)


def view_runs(row, kind: str, runs: list) -> list:
    """The runs (``[start, end)``) of the row's media tokens as they are (each item's token count,
    where its layout fixes it, is `MediaLayout.tokens`)."""
    return runs


def view_summary(row) -> list[str]:
    """What a row's head line adds to its image count beyond its layout's (`MediaLayout.summary`): nothing."""
    return []


def view_pictures(row, kind: str, source: Any = None) -> tuple[None, bool]:
    """No pictures (the stored outputs are not pictures)."""
    return None, True
