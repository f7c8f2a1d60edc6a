"""The type of a processor-kind record's ``layout`` field (`MultiModalInputs.layout`,
`BatchedMultiModalInputs.layout`): what a processor's own call returns, found once per encoder by
the generic path's probe (`mmpipe.media.processor_probe`) and stored with every row as JSON in
`LAYOUT_COLUMN`. A record type, so it lives with the records; the processor kind
(`mmpipe.media.processor`) reads and writes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mmpipe.errors import InputError

__all__ = ["LAYOUT_COLUMN", "ProcessorLayout"]

LAYOUT_COLUMN = "generic_layout"  # the stored JSON of the rows' ProcessorLayout


@dataclass(frozen=True)
class ProcessorLayout:
    """What a processor returns, found once by a probe (`mmpipe.media.processor_probe`): its class,
    its sequence keys (int [L]), its vision keys as ``(name, stored dtype, ndim)``, which of those
    are row keys (axis 0 = the row: padded into [B, ...]) and which the processor's batch call
    JOINS into one array (``joins``; the others are concatenated on axis 0). Every stored row of
    one processor carries the same layout (one schema)."""

    processor_class: str
    sequence: tuple[str, ...] = ()
    vision: tuple[tuple[str, str, int], ...] = ()
    row_keys: tuple[str, ...] = ()
    # (key, values): the processor's fill of a missing item (axis 1) where not 0: a row key's whole item, or
    # one value for a per-image key (Phi-4-multimodal's image_attention_mask: 1)
    pads: tuple = ()
    # (key, axis > 0): one array [1, ...] per batch, the rows' joined along axis (MiniCPM-V's
    # pixel_values [1, 3, 14, patches x 14], axis 3)
    joins: tuple = ()
    # (key, "bfloat16" / "float16"): outputs in a dtype stored as float32 (exact) and handed to the
    # model in the processor's own dtype (Llama 4's bf16 pixel_values; `model_tensors`)
    dtypes: tuple = ()
    # the image processor's settings (`mmpipe.images.settings.image_settings`: a digest, then the
    # size-like ones in words): rows of one class but other settings (a 32-px and a 48-px LLaVA)
    # would be zero-padded into one shape
    # while their ids keep their own image-token counts; "" in rows of an earlier mmpipe (not checked)
    settings: str = ""
    # (mask key, feature key): a per-item mask the processor leaves out of a call with ONE item (Phi-4-multimodal's
    # audio_attention_mask [A, frames], absent for one clip): collate fills it in (all valid) for such rows
    single_masks: tuple = ()
    # the outputs of the processor's audio feature extractor (``input_features``, its masks), found by the audio probe
    audio: tuple = ()

    @classmethod
    def of(cls, processor_class: str, sequence: dict, vision: dict, row_keys=(), *, joins=(),
           dtypes=()) -> "ProcessorLayout":
        """The layout of one row's own outputs (a row built without its encoder's layout)."""
        return cls(processor_class, tuple(sorted(sequence)),
                   tuple((k, str(v.dtype), v.ndim) for k, v in sorted(vision.items())), tuple(row_keys),
                   joins=tuple(joins), dtypes=tuple(dtypes))

    def model_tensors(self, vision: dict) -> dict:
        """``vision`` (numpy or torch) with each key of `dtypes` as a torch tensor in the
        processor's dtype (the stored float32 holds every bf16 / f16 value exactly)."""
        if not self.dtypes:
            return vision
        import torch

        out = dict(vision)
        for key, dtype in self.dtypes:
            if key in out:
                out[key] = torch.as_tensor(out[key]).to(getattr(torch, dtype))
        return out

    def to_json(self) -> str:
        d = {"processor_class": self.processor_class, "sequence": list(self.sequence),
             "vision": [list(v) for v in self.vision], "row_keys": list(self.row_keys)}
        d.update({"pads": [[k, list(v)] for k, v in self.pads]} if self.pads else {})
        d.update({name: [list(x) for x in getattr(self, name)] for name in ("joins", "dtypes", "single_masks")
                  if getattr(self, name)})
        d.update({"audio": list(self.audio)} if self.audio else {})
        d.update({"settings": self.settings} if self.settings else {})
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str, row: Any = None) -> "ProcessorLayout":
        try:
            d = json.loads(text)
            return cls(d["processor_class"], tuple(d["sequence"]), tuple((n, t, int(k)) for n, t, k in d["vision"]),
                       tuple(d["row_keys"]), tuple((k, tuple(v)) for k, v in d.get("pads", ())),
                       tuple((k, int(ax)) for k, ax in d.get("joins", ())),
                       tuple((k, str(t)) for k, t in d.get("dtypes", ())), str(d.get("settings", "")),
                       tuple((str(m), str(f)) for m, f in d.get("single_masks", ())),
                       tuple(str(k) for k in d.get("audio", ())))
        except (TypeError, ValueError, KeyError) as e:
            raise InputError(f"unreadable {LAYOUT_COLUMN} ({type(e).__name__}: {e})", row=row, column=LAYOUT_COLUMN,
                             stage="validate", expected="the JSON mmpipe.encode wrote", found=repr(text)[:80],
                             fix="re-encode the row with mmpipe.encode") from None
