"""The encode stage: raw row (chat messages + images) -> `MultiModalInputs`, one module per step.

=====================  ==================================================================
module                 step
=====================  ==================================================================
``row_checks``         the row's shape before parsing: a dict, one message source, a text/messages completion
``parse``              raw row -> (chat messages, images): the accepted row formats
``sharegpt``           ShareGPT / LLaVA ``conversations`` turns (``from`` / ``value``) read as chat messages
``placeholders``       THE one expand/collapse of image/video pads (one per block <->
                       ``t*h*w/merge^2``), shared by encode, multi-turn, ReMA, rollout inputs
``media``              a raw row's image and video columns, the queues placeholders take them from
``render``             the chat template: renders, a row's tools, assistant spans -> labels
``spans``              where the assistant replies are in a render (generation blocks, markers;
                       a thinking reply's answer marked) and where each turn ends
``prefix_spans``       the fallback: replies by the conversation's prefixes, or a typed refusal
``marked_render``      one render gives the text and the replies' spans where provably exact
                       (replies written out untouched), else the caller renders twice
``text_ids``           rendered (or placeholder-spliced) text -> ids and labels, for the kinds
                       that tokenize the template's text themselves
``encoder``            `Encoder`, every family: options, parse -> the family's media strategy
                       (``fam.media.encode_*``: patch grids, tiles, the processor's own call)
                       -> the validated record; images loaded on threads, empty rows, stats
``tokenize``           a long rendered text tokenized in verified pieces (memory bound by the text)
``call_labels``        labels of ids from a call mmpipe does not own (the generic path's processor)
``options``            the encoder's option checks, a kind's refusals, the truncation policies
``sources``            ``pixels="source"``: the images' file bytes kept, decoded at collate
``videos``             a row's videos -> grids, seconds per grid, uint8 frame patches, pads expanded
``glm_videos``         GLM-4.1V's and GLM-4.6V's video sampling, sizing, text layout and token types
``video_sound``        videos with their sound track for an Omni thinker's own call
``feature_runs``       a tiled family's feature-token runs written once, the ids repeated
``mapping``            the ``datasets.map`` protocol: batches, drops, ``on_error="skip"``,
                       image prefetch across a batch
``layout_batch``       the batched layout-only path (``pixels="none"``): batched renders, one
                       tokenizer call, pads expanded and M-RoPE over the whole batch
``backend_tokenize``   that one tokenizer call read from the ``tokenizers`` backend; labels'
                       offsets from the tokens' byte lengths where exact (byte-level BPE)
``dataset``            `encode` (the map function), `encode_row`, `encode_dataset`,
                       `EncodeReport`, `drop_failed`, `undecoded_images`
``processor_rows``     `rows_from_processor_output` (processor-built rows, videos), `compact`
``fingerprint``        the code stamp in every encode fingerprint (a changed mmpipe reuses no cache)
=====================  ==================================================================
"""

from mmpipe.encoding.dataset import (
    EncodeReport,
    drop_failed,
    encode,
    encode_dataset,
    encode_row,
    undecoded_images,
)
from mmpipe.encoding.encoder import ERROR_POLICIES, TRUNCATION_POLICIES, Encoder
from mmpipe.encoding.mapping import DROP_REASON_COLUMN, EncodeStats, RowDropped, as_input_error
from mmpipe.records.columns import ERROR_COLUMN
from mmpipe.encoding.parse import inline_image, parse_row
from mmpipe.encoding.row_checks import is_image_item
from mmpipe.encoding.placeholders import (
    block_tokens,
    check_roundtrip,
    collapse_placeholders,
    expand_image_pads,
    expand_placeholders,
    repeat_pads,
)
from mmpipe.encoding.processor_rows import compact, rows_from_processor_output

__all__ = [
    "DROP_REASON_COLUMN", "ERROR_COLUMN", "ERROR_POLICIES", "TRUNCATION_POLICIES", "EncodeReport", "EncodeStats",
    "Encoder", "RowDropped", "as_input_error", "block_tokens", "check_roundtrip", "collapse_placeholders", "compact",
    "drop_failed", "encode", "encode_dataset", "encode_row", "expand_image_pads", "expand_placeholders",
    "inline_image", "is_image_item", "parse_row", "repeat_pads", "rows_from_processor_output", "undecoded_images",
]
