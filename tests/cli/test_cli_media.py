"""``mmpipe encode`` with videos and audio clips: the media columns' relative paths resolve against the
input file's directory (`mmpipe.cli.resolve.resolve_media_paths`), and ``--use-audio-in-video`` /
``--video-fps`` / ``--videos-column`` / ``--audios-column`` reach the encoder. The Omni thinker
encode through the command (vision environment: its video processor needs torchvision) equals
``mmpipe.Encoder(processor, use_audio_in_video=True, video_options=...)`` row by row."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest

from mmpipe.cli.encode import CLIError, add_encode_parser, encode_options
from mmpipe.cli.resolve import resolve_media_paths


def _args(*argv):
    import argparse

    ap = argparse.ArgumentParser()
    add_encode_parser(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(["encode", "rows.jsonl", "--processor", "p", "--out", "o", *argv])


def test_media_flags_become_encoder_options():
    opts = encode_options(_args("--use-audio-in-video", "--video-fps", "4", "--videos-column", "clips",
                                "--audios-column", "sounds"))
    assert opts["use_audio_in_video"] is True and opts["video_options"] == {"fps": 4.0}
    assert opts["videos_column"] == "clips" and opts["audios_column"] == "sounds"
    plain = encode_options(_args())
    assert not {"use_audio_in_video", "video_options", "videos_column", "audios_column"} & set(plain)
    with pytest.raises(CLIError, match="--video-fps must be a positive number"):
        encode_options(_args("--video-fps", "0"))


def test_relative_media_paths_resolve_against_the_input(tmp_path):
    ds = datasets.Dataset.from_list([
        {"videos": ["v/a.mp4", "/abs/b.mp4", "~/c.mp4", "https://x/y.mp4"], "audios": ["s.wav"], "n": 1},
        {"videos": [], "audios": None, "n": 2}])
    out = resolve_media_paths(ds, tmp_path, ["videos", "audios", "missing"])
    assert out[0]["videos"] == [str(tmp_path / "v/a.mp4"), "/abs/b.mp4", str(Path("~/c.mp4").expanduser()),
                                "https://x/y.mp4"]
    assert out[0]["audios"] == [str(tmp_path / "s.wav")] and out[1]["audios"] is None and out[1]["videos"] == []
    raw = datasets.Dataset.from_list([{"videos": [b"\x00\x01"]}])  # bytes: left alone, not mapped
    assert resolve_media_paths(raw, tmp_path, ["videos"]) is raw


@pytest.mark.needs_env("vision")
def test_the_command_encodes_videos_with_their_sound(tmp_path, capsys):
    pytest.importorskip("av")
    import mmpipe
    from mmpipe.audio.samples import tone, video_with_sound
    from mmpipe.cli.main import main
    from mmpipe.offline import qwen_omni
    from mmpipe.records.row import MultiModalInputs
    from mmpipe.testing.invariants import assert_rows_equal

    proc = qwen_omni.build_processor(videos=True)
    proc.save_pretrained(tmp_path / "proc")
    (tmp_path / "media").mkdir()
    data, _ = video_with_sound(2.0, fps=4, fmt="mp4", rate=22050, channels=2, seed=4)
    (tmp_path / "media" / "clip.mp4").write_bytes(data)
    import soundfile

    soundfile.write(tmp_path / "media" / "tone.wav", tone(16000, 16000, seed=2)[0], 16000)
    user = lambda *items: {"role": "user", "content": list(items)}  # noqa: E731
    rows = [{"messages": [user({"type": "video"}, {"type": "text", "text": "What happens?"}),
                          {"role": "assistant", "content": "It moves."}], "videos": ["media/clip.mp4"], "audios": []},
            {"messages": [user({"type": "audio"}, {"type": "video"}, {"type": "text", "text": "Both?"}),
                          {"role": "assistant", "content": "Yes."}],
             "videos": ["media/clip.mp4"], "audios": ["media/tone.wav"]}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    status = main(["encode", str(tmp_path / "rows.jsonl"), "--processor", str(tmp_path / "proc"), "--out",
                   str(tmp_path / "enc"), "--use-audio-in-video", "--video-fps", "4", "--quiet"])
    assert status == 0, capsys.readouterr()
    got = [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(datasets.load_from_disk(str(tmp_path / "enc")))]
    absolute = [{**r, "videos": [str(tmp_path / v) for v in r["videos"]],
                 "audios": [str(tmp_path / a) for a in r["audios"]]} for r in rows]
    enc = mmpipe.Encoder(proc, use_audio_in_video=True, video_options={"fps": 4.0})
    want = [enc.encode_row(r, i) for i, r in enumerate(absolute)]
    assert_rows_equal(got, want)
    assert got[0].vision["video_second_per_grid"].tolist() == [0.5]
    assert np.asarray(got[1].vision["feature_attention_mask"]).shape[0] == 2  # the clip and the video's sound
