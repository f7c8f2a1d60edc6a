"""`MediaLayout`: the layout of a record's media items in one typed form, whatever the kind of
family (`mmpipe.media`): a patch grid, tiles (size and tile count), or the size the processor
was given (the generic path, whose outputs' shapes are the processor's own).

Each kind stores its items' layout in its own fields (declared as data: ``MEDIA_ITEMS``, the
fields collate concatenates and unbatch cuts back out); `MediaLayout.of` reads them into one
form, for a row (`MultiModalInputs.media_layout`) and for a batch
(`BatchedMultiModalInputs.media_layout`), so the stages that show or count items (the views,
their labels and sizes) need no kind of their own::

    kind        stored per item (I items)                   MediaLayout
    patches     image_grid_thw / video_grid_thw [I, 3]      grid_thw, tokens (t*h*w // merge**2)
    tiles       image_hw [I, 2], tiles_per_image [I]        hw, tiles
    processor   image_hw [I, 2]                             hw

A field a kind does not store is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mmpipe.records.columns import to_numpy

# the record fields that hold a per-item layout -> the `MediaLayout` field they fill
LAYOUT_FIELDS = {"image_grid_thw": "grid_thw", "video_grid_thw": "grid_thw", "image_hw": "hw",
                 "tiles_per_image": "tiles"}


@dataclass(frozen=True, eq=False)
class MediaLayout:
    """One modality's items of a row or a batch (I items), one typed form for every kind of
    family; a field the kind does not store is None.

        modality:    ``"image"`` or ``"video"``
        grid_thw:    int64 [I, 3] patch grid (t, h, w) (kind ``patches``)
        hw:          int64 [I, 2] upright (height, width) in pixels, as the processor was given the
                     item (kinds ``tiles``, ``processor``; None in generic-path rows of an
                     earlier mmpipe, which stored no sizes)
        tiles:       int64 [I] tiles of each item (kind ``tiles``)
        tokens:      int64 [I] the feature tokens of each item where its layout fixes them (patch
                     grids: ``t*h*w // merge**2``); None where the text decides (tiles: the
                     family's text per tile; the processor's own call)
        patch_size:  the family's patch side in pixels (a grid's size: grid x patch), 0 without grids
    """

    modality: str
    grid_thw: Optional[np.ndarray] = None
    hw: Optional[np.ndarray] = None
    tiles: Optional[np.ndarray] = None
    tokens: Optional[np.ndarray] = None
    patch_size: int = 0

    @classmethod
    def of(cls, record: Any, modality: str = "image") -> "MediaLayout":
        """The layout of ``record``'s (a row or a batch) items of ``modality``, read from the
        fields its kind declares (``fam.media.MEDIA_ITEMS``); an empty layout where the kind has
        no such items (a tiled row's videos)."""
        fam = record.fam
        found: dict = {}
        for items in fam.media.MEDIA_ITEMS:
            if items.modality == modality:
                for name, _, _ in items.fields:
                    value = getattr(record, name, None)
                    if name in LAYOUT_FIELDS and value is not None:
                        found[LAYOUT_FIELDS[name]] = to_numpy(value).astype(np.int64, copy=False)
        grid = found.get("grid_thw")
        if grid is not None:
            found["grid_thw"] = grid = grid.reshape(-1, 3)
            found["tokens"] = np.asarray(fam.tokens_per_grid(grid), np.int64).reshape(-1)
        if found.get("hw") is not None:
            found["hw"] = found["hw"].reshape(-1, 2)
        return cls(modality, patch_size=int(fam.patch_size or 0) if grid is not None else 0, **found)

    def __len__(self) -> int:
        for value in (self.grid_thw, self.hw, self.tiles):
            if value is not None:
                return int(value.shape[0])
        return 0

    @property
    def units(self) -> Optional[np.ndarray]:
        """int64 [I] the stored pixel rows of each item: its patches (``t*h*w``) or its tiles;
        None for the processor's own outputs."""
        if self.grid_thw is not None:
            return self.grid_thw.prod(axis=1)
        return self.tiles

    def size(self, index: int) -> Optional[tuple[int, int]]:
        """(height, width) in pixels of item ``index``: as given (``hw``) where stored, else as
        the model sees it (its grid times the patch size); None for no such item or no size."""
        if not 0 <= index < len(self):
            return None
        if self.hw is not None:
            return int(self.hw[index, 0]), int(self.hw[index, 1])
        if self.grid_thw is not None:
            return int(self.grid_thw[index, 1]) * self.patch_size, int(self.grid_thw[index, 2]) * self.patch_size
        return None

    @property
    def label_shows_size(self) -> bool:
        """Whether `label` shows the item's size (a grid's label shows the grid: its size in
        pixels is a note of its own, ``"W×H px"``)."""
        return self.grid_thw is None

    def label(self, first: int, last: Optional[int] = None) -> str:
        """An item's layout in words: ``"grid 1×4×6"``, ``"40×56 px · 2 tiles"``, ``"40×56 px"``;
        over touching items ``first..last`` (tiles whose runs cannot be cut per item) their
        tiles, ``"5 tiles"``; ``"grid ?×?×?"``, ``"? tiles"``, ``"size unknown"`` without one."""
        last = first if last is None else last
        if self.grid_thw is not None:
            ok = 0 <= first < len(self.grid_thw)
            return "grid " + ("×".join(str(int(x)) for x in self.grid_thw[first]) if ok else "?×?×?")
        if self.tiles is not None:
            if not 0 <= first <= last < len(self.tiles):
                return "? tiles"
            tiles = f"{int(self.tiles[first:last + 1].sum())} tiles"
            return tiles if last != first else f"{self._size_label(first)} · {tiles}"
        return self._size_label(first)

    def _size_label(self, index: int) -> str:
        size = self.size(index)
        return "size unknown" if size is None else f"{size[0]}×{size[1]} px"

    def summary(self) -> list[str]:
        """What a head line adds to the item count: the tiles, ``["3 tiles"]``; [] otherwise."""
        return [] if self.tiles is None else [f"{int(self.tiles.sum())} tiles"]
