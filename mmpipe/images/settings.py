"""An image processor's settings as one comparable string (`image_settings`): rows made with other
settings (a 32-px and a 48-px LLaVA) have other output shapes and image-token counts, so a
batch or a dataset compares them. Any transformers image processor; none of it is per family.
"""

from __future__ import annotations

import hashlib
import json
import re

__all__ = ["image_settings", "size_field"]

# image-processor settings that decide output shapes and token counts (named in `image_settings`)
_SIZE_WORDS = ("size", "pixels", "patch", "crop", "tile", "split", "resample", "pad", "grid", "num_", "max_", "min_")


def size_field(size, key: str):
    """One value of an image processor's ``size`` / ``crop_size``: a ``SizeDict`` (transformers 5,
    attributes) or a plain dict (4.57's slow processors); None where it has none."""
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def image_settings(processor) -> str:
    """The processor's image-processor settings as stored in `ProcessorLayout.settings`: a digest of
    all of them (``to_dict()``), then the size-like ones as JSON (for error messages); "" when the
    processor has no image processor or its settings cannot be read."""
    ip = getattr(processor, "image_processor", None)
    try:
        d = dict(ip.to_dict()) if ip is not None else None
    except Exception:  # noqa: BLE001 - a processor we cannot describe is not checked
        d = None
    if not d:
        return ""
    d = {k: v for k, v in d.items() if k not in ("processor_class", "_processor_class", "image_processor_type")}
    # object reprs carry their address: never part of the settings
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", json.dumps(d, sort_keys=True, default=str))
    sizes = json.dumps({k: d[k] for k in sorted(d) if any(w in k for w in _SIZE_WORDS)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12] + " " + (sizes if len(sizes) <= 300 else sizes[:297] + "...")
