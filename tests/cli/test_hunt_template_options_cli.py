"""``mmpipe encode`` takes the template keywords and a tiled family's call options the `Encoder`
takes: ``--chat-template-kwargs JSON`` (GLM-4.6V ``enable_thinking``, Qwen-VL ``add_vision_id``)
and ``--images-kwargs JSON`` (Gemma 3 pan-and-scan); the saved rows equal ``mmpipe.encode_row``
with those options (and so the processor's chat path, tested in tests/encoding). Before, the CLI
had no way to pass them: a GLM-4.6V dataset could only be encoded with thinking on."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.cli.encode import REPORT_FILE
from mmpipe.cli.main import main

from conftest import processor_for


def _jsonl(tmp_path, image_hw=(40, 56)) -> str:
    img = tmp_path / "a.png"
    testing.tiny_image(*image_hw, seed=3).save(img)
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "A box."}]}],
             "images": [str(img)]}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


CASES = {
    "glm46v no thinking": ("glm46v", "--chat-template-kwargs", {"enable_thinking": False}, "chat_template_kwargs"),
    "qwen2_vl vision ids": ("qwen2_vl", "--chat-template-kwargs", {"add_vision_id": True}, "chat_template_kwargs"),
    "gemma3 pan and scan": ("gemma3", "--images-kwargs", {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 4,
                                                          "pan_and_scan_min_ratio_to_activate": 1.1}, "images_kwargs"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_encode_flags_equal_the_encoder_options(tmp_path, case, capsys):
    family, flag, value, option = CASES[case]
    src, out = _jsonl(tmp_path, (40, 120) if family == "gemma3" else (40, 56)), tmp_path / "out"
    rc = main(["encode", src, "--processor", f"testing:{family}", "--out", str(out), "--quiet", flag, json.dumps(value)])
    assert rc == 0, capsys.readouterr().err
    got = mmpipe.MultiModalInputs.from_dict(datasets.load_from_disk(str(out))[0], row=0)
    raw = json.loads(open(src).read())
    want = mmpipe.encode_row(raw, processor_for(family), **{option: value})
    assert got.diff(want) == []
    plain = mmpipe.encode_row(raw, processor_for(family))
    assert not np.array_equal(plain.input_ids, want.input_ids)  # the option changes the row: the check can tell
    assert json.loads((out / REPORT_FILE).read_text())["options"][option] == value


@pytest.mark.parametrize("text", ["[1, 2]", "{not json"])
def test_a_value_that_is_not_a_json_object_is_a_usage_error(tmp_path, text, capsys):
    with pytest.raises(SystemExit) as e:
        main(["encode", _jsonl(tmp_path), "--processor", "testing:qwen2_vl", "--out", str(tmp_path / "o"),
              "--chat-template-kwargs", text])
    assert e.value.code == 2 and "--chat-template-kwargs must be a JSON object" in capsys.readouterr().err
