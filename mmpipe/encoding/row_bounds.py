"""The most bytes one encoded row can hold (`row_byte_bound`), which sizes the batches and writer
buffers of `mmpipe.map_kwargs` and `mmpipe.encode_dataset`; and the image size bound where an
encoder keeps images at their own size (the image processor's ``do_resize=False``: ``max_pixels``
then bounds nothing, so the dataset's largest image, read from the headers, bounds it instead)."""

from __future__ import annotations

from typing import Optional

__all__ = ["row_byte_bound", "unresized_pixels"]

_TEXT_ROW_BYTES = 2**20  # allowance per row for ids, labels, [3, L] positions (~46 bytes per text byte)


def row_byte_bound(enc, n_images: int, pixels: Optional[int] = None) -> int:
    """Most bytes one encoded row of ``enc`` with ``n_images`` images can hold: each image's
    most stored bytes (`Encoder.image_bytes`: at ``pixels`` (`unresized_pixels`), else the
    encoder's ``max_pixels``, in its stored pixel format; a tiled family's most tiles; the
    generic path's processor outputs for one 2048x2048 image), plus the token arrays' allowance."""
    per_image = enc.image_bytes()
    if pixels is not None and per_image:  # stored bytes grow with the pixels (patch-grid families)
        per_image = -(-per_image * pixels // enc.spec.max_pixels)
    return _TEXT_ROW_BYTES + per_image * max(1, n_images)


def unresized_pixels(enc, ds, images_column: str = "images") -> Optional[int]:
    """The pixels of the largest image in ``ds[images_column]`` where ``enc`` keeps images at
    their own size (the image processor's ``do_resize=False``: ``max_pixels`` bounds nothing;
    measured: 1400x1400 photos under a 50,176-pixel ``max_pixels`` filled a writer batch with
    4.9x its byte budget), read from the headers (`mmpipe.images.load.image_hw`; no pixel
    decoded; an image that fails is the encode's to report); PIL's ``MAX_IMAGE_PIXELS`` where the images cannot
    be listed (a stream, no such column). None where ``max_pixels`` bounds the images."""
    spec, kind = getattr(enc, "spec", None), getattr(getattr(enc, "family", None), "kind", None)
    if spec is None or spec.do_resize or kind != "patches" or getattr(enc, "pixels", None) not in ("uint8", "float32"):
        return None  # bounded by max_pixels; a tiled family's tiles bound themselves
    import pyarrow as pa
    from PIL import Image

    from mmpipe.errors import InputError
    from mmpipe.images.headers import plain_image_hw
    from mmpipe.images.load import image_hw

    if getattr(ds, "data", None) is None or images_column not in getattr(ds, "column_names", ()):
        return int(Image.MAX_IMAGE_PIXELS or 2**31)
    most = 0
    for batch in ds.select_columns([images_column]).with_format("arrow").iter(batch_size=256):
        col = batch.column(images_column).combine_chunks()
        values = col.flatten() if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) else col
        for value in values.to_pylist():
            data = value.get("bytes") if isinstance(value, dict) else value
            try:
                hw = plain_image_hw(data) if isinstance(data, bytes) else None
                h, w = hw if hw is not None else image_hw(value, where="map_kwargs")
            except (InputError, TypeError):
                continue
            most = max(most, h * w)
    return most or None
