"""What the command line tells a user is true: the CLI reference page (docs/reference/cli.md, where the
README's CLI section moved) lists every command and
option the parser has (and nothing it lacks), and ``--on-error skip``'s record of a row whose
image path did not resolve says where relative paths are looked up (issue 28)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mmpipe.cli.encode import REPORT_FILE
from mmpipe.cli.main import _parser, main
from mmpipe.testing import tiny_image

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "docs" / "reference" / "cli.md").read_text()


def _cli_section() -> str:
    return README


def _subparsers(parser):
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def _commands() -> dict:
    """``{"encode": parser, ..., "judge ping": parser}``: every command a user can run."""
    out = {}
    for name, sub in _subparsers(_parser()).items():
        if name == "judge":
            out.update({f"judge {n}": p for n, p in _subparsers(sub).items()})
        else:
            out[name] = sub
    return out


def _options(parser) -> set:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


def test_the_readme_cli_section_names_every_command():
    text = _cli_section()
    commands = _commands()
    assert set(commands) == {"encode", "inspect", "validate", "demo", "judge ping"}
    missing = [c for c in commands if f"mmpipe {c}" not in text]
    assert not missing, f"the README's CLI section does not show: {missing}"
    words = {3: "Three", 4: "Four", 5: "Five", 6: "Six"}
    assert f"{words[len(commands)]} commands" in text


def test_the_readme_cli_section_names_every_option_and_no_other():
    text = _cli_section()
    commands = _commands()
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    for name in ("encode", "inspect", "validate", "judge ping"):  # demo's own options: `mmpipe demo --help`
        missing = _options(commands[name]) - documented
        assert not missing, f"mmpipe {name}: {sorted(missing)} not in the README's CLI section"
    known = set().union(*(_options(p) for p in commands.values())) | _options(_demo_parser())
    assert documented <= known, f"the README's CLI section names options no command has: {sorted(documented - known)}"


def _demo_parser():
    from mmpipe.cli import demo

    return demo.parser()


def test_the_readme_cli_section_names_every_pixel_format():
    from mmpipe.records.columns import ENCODE_PIXEL_FORMATS

    text = _cli_section()
    m = re.search(r"--pixels ([a-z0-9|]+)", text)
    assert m and set(m.group(1).split("|")) == set(ENCODE_PIXEL_FORMATS), m and m.group(0)


# ---- the --on-error skip record --------------------------------------------------------------
@pytest.fixture
def rows_elsewhere(tmp_path, monkeypatch):
    """rows.jsonl in data/ (images in data/imgs/), run from another working directory."""
    data = tmp_path / "data"
    (data / "imgs").mkdir(parents=True)
    tiny_image(40, 60).save(data / "imgs" / "0.png")
    (data / "imgs" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    msg = lambda p: {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],  # noqa: E731
                     "images": [p]}
    src = data / "rows.jsonl"
    src.write_text("".join(json.dumps(msg(p)) + "\n" for p in ("imgs/0.png", "imgs/missing.png", "imgs/broken.png")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return src


def test_on_error_skip_records_where_relative_paths_were_looked_up(rows_elsewhere, capsys):
    out = rows_elsewhere.parent.parent / "enc"
    assert main(["encode", str(rows_elsewhere), "--processor", "testing:qwen2_vl", "--out", str(out), "--quiet",
                 "--on-error", "skip"]) == 0
    assert "encoded 1 of 3 rows" in capsys.readouterr().out
    errors = {e["row"]: e for e in json.loads((out / REPORT_FILE).read_text())["errors"]}
    assert sorted(errors) == [1, 2] and {e["stage"] for e in errors.values()} == {"image"}
    missing = errors[1]["reason"]
    assert "working directory" not in missing, missing  # they are not looked up there
    assert "input file's directory" in missing and str(rows_elsewhere.parent.resolve()) in missing, missing
    assert "imgs/missing.png" in missing
    # a file that exists but does not decode keeps the encoder's own reason
    assert "broken.png" in errors[2]["reason"] and "input file's directory" not in errors[2]["reason"]


def test_on_error_raise_says_the_same(rows_elsewhere, capsys):
    out = rows_elsewhere.parent.parent / "enc_raise"
    assert main(["encode", str(rows_elsewhere), "--processor", "testing:qwen2_vl", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "input file's directory" in err and "working directory" not in err and "--on-error skip" in err
