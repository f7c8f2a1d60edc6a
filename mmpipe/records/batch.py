"""`BatchedMultiModalInputs`: B encoded rows of one family padded to one length, as torch
tensors (the collate stage's output, the forward pass's input), with its one-row Arrow schema.

Positions follow the layout stated in `mmpipe.records`: ``position_ids`` int64 ``[P, B, L]``
(3 M-RoPE rows for the patch-grid families, 1 for the others).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import pyarrow as pa

from mmpipe._fork import torch_fork_safe
from mmpipe.errors import InputError
from mmpipe.images.spec import VisionSpec
from mmpipe.records.batch_arrow import batch_arrow_schema, batch_to_arrow
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import FamilyRecord, ProcessorOutputs
from mmpipe.records.display_hooks import Displayed
from mmpipe.records.media_layout import MediaLayout

if TYPE_CHECKING:  # records never import torch: the tensors are made by collate
    import torch

    from mmpipe.records.processor_layout import ProcessorLayout


@dataclass(eq=False)
class BatchedMultiModalInputs(FamilyRecord, ProcessorOutputs, Displayed):
    """A padded batch of B rows of one family (torch tensors), whatever its kind
    (`mmpipe.families.ModelFamily.kind`; `mmpipe.media`).

    The patch-grid families' collate gives torch tensors; the 1-D kinds' (tiles, processor)
    numpy arrays, as their collates always did (`as_torch` converts; `model_inputs` gives torch).

    Attributes (L = padded length, I = images
    in the batch, N = their patches or tiles, V = videos, Nv = their patches, p = patch size,
    T = temporal patch size):
        input_ids:          int64 [B, L]
        attention_mask:     int64 [B, L]
        mm_token_type_ids:  int64 [B, L] 0 text, 1 image, 2 video (tiles: 1 at feature tokens)
        position_ids:       pads 0: int64 [3, B, L] M-RoPE (the batch layout of `mmpipe.records`;
                            `model_inputs(positions="verl")` gives [4, B, L] with the plain text
                            row first); int64 [B, L] ``0..n-1`` per row for the 1-D families.
        rope_deltas:        int64 [B, 1]
        labels:             int64 [B, L] or None (-100 on pads)
        image_offsets:      int64 [B+1]; row b owns images image_offsets[b]:image_offsets[b+1]
                            (`sample_to_image_indices`), every kind.
        image_grid_thw:     int64 [I, 3] (kind ``patches``; [0, 3] otherwise)
        image_hw:           int64 [I, 2] or None: upright sizes (kinds ``tiles``, ``processor``)
        tiles_per_image:    int64 [I] or None (kind ``tiles``)
        patch_offsets:      int64 [B+1]; row b owns pixel rows (patches, or tiles)
                            patch_offsets[b]:patch_offsets[b+1]
        pixel_values:       float32 [N, 3*T*p*p] (patches), the processor's layout for tiles
                            (e.g. [N, 3, S, S]), or None (no image in the batch / no pixels)
        pixel_values_u8:    uint8 [N, 3*p*p] patches or [N, S, S, 3] tiles, or None, kept when
                            rows were compact (exact unbatch, and the images for rollout engines)
        pixel_values_videos:    float32 [Nv, 3*T*p*p] or None.
        pixel_values_videos_u8: uint8 [Nv, 3*T*p*p] or None (compact video rows).
        video_grid_thw:     int64 [V, 3]
        second_per_grid_ts: float32 [V] seconds per temporal grid step.
        video_offsets:      int64 [B+1]; row b owns videos video_offsets[b]:video_offsets[b+1]
        video_patch_offsets: int64 [B+1]; row b owns video pixel rows likewise.
        seq_lengths:        int64 [B], each row's unpadded length.
        extras:             further model inputs by name, typed by the family (LLaVA-OneVision
                            ``image_sizes`` int64 [I, 2], ...).
        sequence, vision:   kind ``processor``: the processor's other [B, L] outputs and its
                            vision outputs by name (`mmpipe.media.processor`), typed by ``layout``.
        layout:             kind ``processor``: the rows' `ProcessorLayout` (unbatch gives it back).
        shapes:             kind ``processor``: each row's own shape per vision key (None where
                            the row lacks it), what unbatch cuts back to.
        row_has_labels:     bool [B] or None, which rows carried labels.
        row_pixel_formats:  list[str] of B or None, each row's pixel storage (for an exact unbatch).
        row_images_kwargs:  kind ``tiles``: list of B (dict or None), each row's encoder
                            ``images_kwargs`` (Gemma 3 pan-and-scan), for an exact unbatch; None
                            when no row has any.
        row_audio_sources:  kind ``processor``: list of B (list of audio file bytes, or None), the
                            clips of rows encoded with ``audio="source"`` (their features, computed
                            at collate, are in ``vision``), for an exact unbatch; None when no row has any.
        row_image_sources:  kinds ``patches``, ``tiles``: list of B (list of image file bytes, or
                            None), the files of rows encoded with ``pixels="source"`` (decoded at
                            collate into the batch's pixels), for an exact unbatch; None when no row has any.
        spec:               the `VisionSpec` used to build float32 pixels, or None.
        padding_side:       "left" or "right".
        family:             model family name.
        pixel_format:       the rows' pixel storage ("uint8", "float32", "none").
        columns:            pass-through columns (``Collator(keep_columns=...)``, e.g. ``id``,
                            ``data_source``): name -> list of B values in row order, or None.
    """

    _html_kind = "batch_html"  # a class attribute, not a field: the `Displayed` renderer

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mm_token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    rope_deltas: torch.Tensor
    image_grid_thw: torch.Tensor
    image_offsets: torch.Tensor
    patch_offsets: torch.Tensor
    video_grid_thw: torch.Tensor
    second_per_grid_ts: torch.Tensor
    video_offsets: torch.Tensor
    video_patch_offsets: torch.Tensor
    seq_lengths: torch.Tensor
    padding_side: str
    family: str
    pixel_format: str
    labels: Optional[torch.Tensor] = None
    pixel_values: Optional[torch.Tensor] = None
    pixel_values_u8: Optional[torch.Tensor] = None
    pixel_values_videos: Optional[torch.Tensor] = None
    pixel_values_videos_u8: Optional[torch.Tensor] = None
    row_has_labels: Optional[torch.Tensor] = None
    row_pixel_formats: Optional[list[str]] = None
    row_images_kwargs: Optional[list] = None
    row_audio_sources: Optional[list] = None
    row_image_sources: Optional[list] = None
    spec: Optional[VisionSpec] = None
    columns: Optional[dict[str, list]] = None
    image_hw: Optional[torch.Tensor] = None
    tiles_per_image: Optional[torch.Tensor] = None
    extras: dict = field(default_factory=dict)
    sequence: dict = field(default_factory=dict)
    vision: dict = field(default_factory=dict)
    layout: Optional["ProcessorLayout"] = None
    shapes: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [B] tokens per row (`seq_lengths`)."""
        return self.seq_lengths

    @property
    def images_per_row(self) -> torch.Tensor:
        """int64 [B] images of each row."""
        return self.image_offsets[1:] - self.image_offsets[:-1]

    @property
    def sample_to_image_indices(self) -> list[list[int]]:
        """Per row, the indices of its images (in ``image_grid_thw`` / ``image_hw`` and the pixel
        blocks). Generic-path rows of an earlier mmpipe, which stored no ``image_hw``, do not know
        their images: an `InputError` saying to re-encode (not a list claiming no images)."""
        if self.image_hw is None and self.fam.media.IMAGE_LAYOUT_COLUMN == "image_hw":
            raise InputError("rows of an earlier mmpipe stored no image_hw: which row owns which image is "
                             "unknown", where="", column="image_hw", stage="collate", expected="an image_hw column",
                             found="none (rows of an earlier mmpipe)",
                             fix="re-encode the dataset with mmpipe.encode (or `mmpipe encode`), which stores it")
        off = self.image_offsets.tolist()
        return [list(range(off[b], off[b + 1])) for b in range(self.batch_size)]

    def media_layout(self, modality: str = "image") -> "MediaLayout":
        """The batch's images (``modality="video"``: videos), row after row (`image_offsets`), in
        the one typed form of every kind (`mmpipe.records.media_layout.MediaLayout`)."""
        return MediaLayout.of(self, modality)

    @property
    def sample_to_video_indices(self) -> list[list[int]]:
        off = self.video_offsets.tolist()
        return [list(range(off[b], off[b + 1])) for b in range(self.batch_size)]

    @property
    def image_to_sample(self) -> torch.Tensor:
        """int64 [I]: the row each image belongs to (a torch tensor for every kind: the 1-D kinds'
        offsets are numpy)."""
        import torch

        off = torch.as_tensor(self.image_offsets)
        return torch.repeat_interleave(torch.arange(self.batch_size), off[1:] - off[:-1])

    def model_inputs(self, device=None, *, positions: Optional[str] = None, labels: bool = True) -> dict[str, Any]:
        """Exactly the kwargs the family's transformers ``forward`` accepts.

        Pixel data goes to the device of ``input_ids`` (or ``device``); a batch collated with
        ``pixels_on_device`` sends its uint8 pixels there and expands them there. Keys without data
        (no image in the batch) are left out, so a text-only batch runs a text-only forward.
        ``positions``: ``"mrope"`` (the default of the M-RoPE families) -> position_ids [3, B, L];
        ``"verl"`` -> [4, B, L] with the plain text positions first; ``"1d"`` (the default of the
        others) -> [B, L]; ``"none"`` -> let the model compute them. In a forked child (a ``Pool``)
        torch runs on one thread first (`mmpipe._fork.torch_fork_safe`).
        """
        torch_fork_safe()
        dev = device if device is not None else getattr(self.input_ids, "device", None)
        out: dict[str, Any] = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        out.update(self.fam.media.position_inputs(self, positions))
        on_device = self.fam.media.device_pixels(self, dev)  # pixels kept uint8 by collate: expanded on dev
        out.update((dataclasses.replace(self, **on_device) if on_device else self).vision_inputs())
        # a batch with no target token (RL prompts) gets no labels: the loss would be NaN
        if labels and self.labels is not None and bool((self.labels != IGNORE_INDEX).any()):
            out["labels"] = self.labels
        # flags (a bool such as the Omni thinkers' use_audio_in_video) go as they are
        return {k: v if isinstance(v, bool) else _torch(v) if dev is None else _torch(v).to(dev) for k, v in out.items()}

    def as_torch(self) -> "BatchedMultiModalInputs":
        """The same batch with every numpy field (and ``extras`` / ``sequence`` / ``vision``
        value) as a torch tensor (zero-copy); a torch batch is returned as it is."""
        if not isinstance(self.input_ids, np.ndarray):
            return self
        return self._with_arrays(np.ndarray, _torch)

    def pin_memory(self) -> "BatchedMultiModalInputs":
        """The same batch with every torch tensor (the fields and the ``extras`` / ``sequence`` /
        ``vision`` values) in pinned host memory. ``DataLoader(pin_memory=True)`` calls this: its
        pin step pins a tensor, a dict, a sequence or an object with a ``pin_memory`` method, and
        hands any other object over as it is (unpinned, silently). numpy fields (the kinds whose
        batches stay numpy until ``model_inputs``) are left as they are."""
        import torch

        return self._with_arrays(torch.Tensor, lambda t: t.pin_memory())

    def _with_arrays(self, kind: type, fn) -> "BatchedMultiModalInputs":
        """The batch with ``fn`` applied to every field, and every ``extras`` / ``sequence`` /
        ``vision`` value, of type ``kind``."""
        change = {f.name: fn(v) for f in dataclasses.fields(self) if isinstance(v := getattr(self, f.name), kind)}
        change.update({n: {k: fn(v) if isinstance(v, kind) else v for k, v in getattr(self, n).items()}
                       for n in ("extras", "sequence", "vision")})
        return dataclasses.replace(self, **change)

    def vision_inputs(self, token_types: Optional[torch.Tensor] = None) -> dict[str, Any]:
        """The family's media kwargs of ``forward``, only those with data (`mmpipe.media`:
        ``pixel_values`` + ``image_grid_thw`` for the patch grids, ``pixel_values`` + the family's
        extras for tiles, the processor's own outputs on the generic path). Empty for a text-only
        batch or family. ``token_types``: the token types to hand over where the family takes
        them as a media input (a pack's [1, T]; default the batch's ``mm_token_type_ids``)."""
        return self.fam.media.model_inputs(self, self.mm_token_type_ids if token_types is None else token_types)

    def __repr__(self) -> str:
        return (
            f"BatchedMultiModalInputs(family={self.family!r}, B={self.batch_size}, "
            f"L={int(self.input_ids.shape[1])}, images_per_row={[len(x) for x in self.sample_to_image_indices]}, "
            f"pixels={self.pixel_format}, padding={self.padding_side})"
        )

    def to_arrow(self) -> pa.Table:
        """This batch as a one-row Arrow table with `arrow_schema` (for logging or shipping)."""
        return batch_to_arrow(self)

    @staticmethod
    def arrow_schema() -> pa.Schema:
        """A batch of any family as one Arrow record (`mmpipe.records.batch_arrow`; dtypes as in torch)."""
        return batch_arrow_schema()

    @staticmethod
    def features():
        import datasets

        return datasets.Features.from_arrow_schema(BatchedMultiModalInputs.arrow_schema())


def _torch(v):
    """A numpy array -> a torch tensor (zero-copy where contiguous); a tensor as it is."""
    if isinstance(v, np.ndarray):
        import torch

        return torch.from_numpy(np.ascontiguousarray(v))
    return v
