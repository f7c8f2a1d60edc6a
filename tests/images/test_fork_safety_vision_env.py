"""`test_fork_safety`'s routes where transformers' torch ("fast") processors run (vision environment:
they need torchvision): ``datasets.map(num_proc=2)`` after the parent ran a parallel torch op, each in
a child process group killed on timeout (a hang fails the test):

- ``fast_image_processor``: LLaVA (the generic path) with the torchvision ``CLIPImageProcessor``;
- ``audio_in_video``: Qwen2.5-Omni with ``use_audio_in_video=True`` (frames through its video
  processor, each video's sound through the Whisper extractor's torch STFT).

Without `mmpipe._fork.torch_fork_safe` before the processor call both hung or lost a worker.
"""

import os

import pytest

pytestmark = pytest.mark.needs_env("vision")
pytest.importorskip("datasets")
pytest.importorskip("av")

from test_fork_safety import HEAD, run_child  # noqa: E402

ROUTES = {
    "fast_image_processor": """
import transformers
proc = load_processor("testing:llava")
proc.image_processor = transformers.CLIPImageProcessor.from_dict(proc.image_processor.to_dict())
assert proc.image_processor.backend == "torchvision"
opts = {}
rows = [{"messages": msgs("image"), "images": [Image.fromarray(rng.integers(0, 255, (224, 224, 3), np.uint8))]}
        for _ in range(4)]
""",
    "audio_in_video": """
from mmpipe.offline.qwen_omni import build_processor
from mmpipe.audio.samples import video_with_sound
proc = build_processor(videos=True)
opts = {"use_audio_in_video": True}
rows = [{"messages": msgs("video"), "videos": [video_with_sound(2.0, fps=4, size=(120, 160), seed=i)[0]]}
        for i in range(4)]
""",
}
MAP = """
ds = datasets.Dataset.from_list(rows)
parent_op()
enc = ds.map(mmpipe.Encoder(proc, **opts), with_indices=True, num_proc=2, remove_columns=ds.column_names)
print("done", len(enc))
"""


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_map_workers_with_torch_processors_after_a_parent_torch_op_do_not_hang(route):
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run_child(HEAD.format(tests=tests) + ROUTES[route] + MAP)
