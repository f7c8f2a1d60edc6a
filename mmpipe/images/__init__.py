"""Images in, resized uint8 patches out, and float32 ``pixel_values`` back at collate time.

The transformers PIL Qwen image processor does: RGB conversion (alpha composited on
white) -> bicubic PIL resize of the uint8 image to the `smart_resize` size -> ``x/255`` ->
``(x - mean) / std`` in float32 -> patch layout. Everything after the resize is a function
of each uint8 value and its channel, so a 256-entry table per channel reproduces the
processor bit for bit (`VisionSpec.lut`). We therefore store the resized uint8 image once
and produce float32 only when a batch is built.

Bad input (policy, tested by the corpus in ``tests/bad_inputs.py``): every failure is an
`mmpipe.errors.ImageError` naming the image. EXIF orientation is applied on every route
(bytes, path, PIL, ``datasets.Image()``; the layout-only path reads it from the header, a PNG's
chunk list included: `mmpipe.images.orientation`), the EXIF block's else the XMP one's, so
an EXIF-rotated photo is upright - as ``datasets`` decodes it, and unlike the transformers
processor given the raw PIL image, which ignores the tag. Modes convert as the processor
does (``convert("RGB")``, transparency over white); 16-bit/int/float modes whose values do
not fit 0..255 raise instead of being clipped to white. Images beyond PIL's
decompression-bomb limit (2 x ``PIL.Image.MAX_IMAGE_PIXELS``) raise, which bounds decode
memory (PIL holds RGB in 4 bytes per pixel; grayscale, 1, is resized before RGB conversion).
Image paths are opened only when they are regular files, and read up to a bound
(``$MMPIPE_MAX_IMAGE_BYTES``, default 256 MiB; `read_image_file`): a FIFO, directory,
device, socket, symlink loop or missing file raises instead of blocking or reading forever.
`confine_image` refuses paths outside a root directory (``Encoder(image_root=...)``).
"""

from mmpipe.images.load import (
    check_image_file,
    confine_image,
    exif_orientation,
    image_hw,
    image_path,
    load_image,
    max_image_bytes,
    open_image_file,
    read_image_file,
    read_pixels,
    to_rgb_array,
    to_rgb_image,
    upright,
)
from mmpipe.images.pixels import (
    encode_image,
    image_grid,
    patchify_u8,
    pixel_values_to_u8,
    resize_image,
    u8_to_pixel_values,
    u8_video_to_pixel_values,
    unpatchify_u8,
    video_pixel_values_to_u8,
)
from mmpipe.images.spec import VisionSpec, smart_resize
from mmpipe.images.threads import default_threads, thread_pool

__all__ = [
    "VisionSpec", "check_image_file", "confine_image", "default_threads", "encode_image", "exif_orientation",
    "image_grid", "image_hw", "image_path", "load_image", "max_image_bytes", "open_image_file", "read_image_file",
    "read_pixels", "patchify_u8", "pixel_values_to_u8", "resize_image", "smart_resize", "thread_pool", "to_rgb_array",
    "to_rgb_image",
    "u8_to_pixel_values", "u8_video_to_pixel_values", "unpatchify_u8", "upright", "video_pixel_values_to_u8",
]
