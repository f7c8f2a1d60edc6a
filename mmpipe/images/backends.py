"""The two image-processor backends of transformers' Qwen-VL image processor, reproduced bit for
bit without torchvision: which one a processor uses, its resize, and its uint8 -> float32 table.

transformers 5 has two implementations of the same processor: ``"pil"`` (numpy/PIL,
``Qwen2VLImageProcessorPil``; what loads where torchvision is missing) and ``"torchvision"``
(``Qwen2VLImageProcessor`` where torchvision imports; what GPU users and vLLM get). Their
``pixel_values`` differ (up to ~0.27 on small images): the rollout engine and the trainer must
use the same one, or the logprobs they compute for the same tokens disagree.

- resize: PIL's bicubic on the PIL image (``"pil"``), or torch's antialiased bicubic
  (``interpolate(mode="bicubic", antialias=True, align_corners=False)``) on the uint8
  ``[1, 3, H, W]`` tensor (``"torchvision"``: what torchvision's ``resize`` runs on CPU for
  uint8 bicubic; elsewhere it resizes in float32, then clamps to 0..255 and rounds).
- rescale + normalise: ``float32(v * (1/255) in float64)``, then ``(x - mean) / std`` in
  float32 (``"pil"``); or one fused step, ``(float32(v) - mean*255) / (std*255)`` with the
  fused constants computed in float32 (``"torchvision"``).

Both resize a uint8 image to a uint8 image, so mmpipe's compact storage (the resized uint8
image) keeps working; only the table (`lut`) that expands it to floats differs.

An engine's option (``"vllm"``) names the backend the engine's processor runs (vLLM: torchvision)
and the transparency rule the engine applies before it (`engine_transparency`; vLLM composites
every image onto white, whatever its transformers does).
"""

from __future__ import annotations

import numpy as np

from mmpipe._fork import torch_fork_safe
from mmpipe.errors import ArgumentError
from mmpipe.images.transparency import ENGINE_TRANSPARENCY

BACKENDS = ("pil", "torchvision")
ENGINE_BACKENDS = {"vllm": "torchvision"}  # engine -> the image-processor backend its processor runs
OPTIONS = ("auto",) + BACKENDS + tuple(ENGINE_BACKENDS)


def processor_backend(processor) -> str:
    """The backend of a processor's (or an image processor's) Qwen image processor:
    transformers 5's ``backend`` property, else the class name (``...Pil`` -> ``"pil"``,
    ``...Fast`` -> ``"torchvision"``: the transformers 4 names); ``"pil"`` when unknown."""
    ip = getattr(processor, "image_processor", processor)
    backend = getattr(ip, "backend", None)
    if isinstance(backend, str) and backend in BACKENDS:
        return backend
    name = type(ip).__name__
    return "torchvision" if name.endswith("Fast") else "pil"


def resolve_backend(option: str, processor=None) -> str:
    """``"auto"`` -> `processor_backend` (``"pil"`` without a processor); ``"pil"`` /
    ``"torchvision"`` as given; an engine (``"vllm"``) -> its processor's backend
    (``"torchvision"``); anything else is an ArgumentError."""
    if option not in OPTIONS:
        raise ArgumentError(f"image_backend must be one of {OPTIONS}, got {option!r}")
    if option == "auto":
        return processor_backend(processor) if processor is not None else "pil"
    return ENGINE_BACKENDS.get(option, option)


def engine_transparency(option: str):
    """The transparency rule (`mmpipe.images.transparency.TRANSPARENCY_RULES`) an ``image_backend``
    option fixes: an engine's own (``"vllm"`` -> ``"white"``), None for the transformers
    backends (their rule is the installed transformers', `mmpipe.images.transparency.transparency_rule`)."""
    return ENGINE_TRANSPARENCY.get(option)


def resize_u8_torch(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [height, width, 3] as the torchvision backend resizes it:
    torchvision's ``resize_image`` for a uint8 CPU tensor with bicubic interpolation and
    antialias (it calls torch's uint8 kernel directly, no float round trip). Same size: the
    input, unchanged (torchvision returns it as is)."""
    import torch
    import torch.nn.functional as F

    if img.shape[:2] == (height, width):
        return img
    torch_fork_safe()  # a parallel op in a forked map worker deadlocks otherwise (every video frame runs here)
    t = torch.from_numpy(np.require(img, requirements=["C", "W"])).permute(2, 0, 1).contiguous()[None]
    out = F.interpolate(t, size=[height, width], mode="bicubic", align_corners=False, antialias=True)
    return np.ascontiguousarray(out[0].permute(1, 2, 0).numpy())


def lut(backend: str, rescale_factor: float, do_rescale: bool, do_normalize: bool, mean, std) -> np.ndarray:
    """float32 [3, 256]: the backend's ``pixel_values`` value for each uint8 value of each
    channel, computed with that backend's own float operations."""
    v = np.arange(256, dtype=np.uint8)
    if backend == "pil":
        x = (v.astype(np.float64) * rescale_factor if do_rescale else v.astype(np.float64)).astype(np.float32)
        if not do_normalize:
            return np.stack([x, x, x])
        m, s = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
        return ((x[None, :] - m[:, None]) / s[:, None]).astype(np.float32)
    if backend != "torchvision":
        raise ArgumentError(f"image backend must be one of {BACKENDS}, got {backend!r}")
    import torch

    x = torch.from_numpy(v).to(torch.float32)
    if do_normalize:
        # transformers' TorchvisionBackend._fuse_mean_std_and_rescale_factor, then tvF.normalize
        m = torch.tensor(list(mean), dtype=torch.float32)
        s = torch.tensor(list(std), dtype=torch.float32)
        if do_rescale:
            m, s = m * (1.0 / rescale_factor), s * (1.0 / rescale_factor)
        out = (x[None, :] - m[:, None]) / s[:, None]
    elif do_rescale:
        out = (torch.from_numpy(v) * rescale_factor).expand(3, 256)  # uint8 * float: float32
    else:
        out = x.expand(3, 256)
    return np.ascontiguousarray(out.numpy(), dtype=np.float32)
