"""The reference pages against the code (docs hunt): every public name of ``mmpipe.__all__`` is
on the API page (a mkdocstrings ``:::`` entry that resolves to the same object, or a constant
named with its value), and the hand-written signatures of the reference pages match
``inspect.signature``."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import mmpipe

ROOT = Path(__file__).resolve().parents[2]
API = (ROOT / "docs" / "reference" / "api.md").read_text()
RECORDS = (ROOT / "docs" / "concepts" / "records.md").read_text()


def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))  # a module of that name wins (as mkdocstrings reads it)
        except ImportError:
            obj = getattr(obj, part)
    return obj


def _documented_objects() -> list:
    return [_resolve(d) for d in re.findall(r"^::: ([\w.]+)\s*$", API, flags=re.M)]


PUBLIC = [n for n in mmpipe.__all__ if not inspect.ismodule(getattr(mmpipe, n))]


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_on_the_api_page(name):
    obj = getattr(mmpipe, name)
    if f"### `mmpipe.{name}`" in API:  # a section written by hand (mmpipe.encode)
        return
    if callable(obj):
        assert any(o is obj for o in _documented_objects()), (
            f"mmpipe.{name} has no '::: ...' entry on docs/reference/api.md (or its entry names another object)")
    else:  # a constant: named with its value
        assert f"`mmpipe.{name}` ({obj!r})" in API, f"docs/reference/api.md does not give mmpipe.{name} = {obj!r}"


def test_api_entries_name_the_object_not_its_module():
    """``::: mmpipe.batching.token_counts`` renders the module of that name, not the function
    `mmpipe.token_counts`: an entry must resolve to a function or class, not a module
    (mmpipe.view, documented as a module, excepted)."""
    modules = [d for d in re.findall(r"^::: ([\w.]+)\s*$", API, flags=re.M)
               if inspect.ismodule(_resolve(d)) and d != "mmpipe.view"]
    assert not modules, modules


def _params(sig_text: str) -> dict:
    """``a, b=1, *, c="x"`` -> {name: default text or None}."""
    out = {}
    for part in sig_text.split(","):
        part = part.strip()
        if part in ("*", "") or part.startswith("**"):
            continue
        name, _, default = part.partition("=")
        out[name.strip()] = default.strip() or None
    return out


def _check(obj, sig_text: str):
    sig = inspect.signature(obj)
    for name, default in _params(sig_text).items():
        assert name in sig.parameters, f"{obj.__qualname__}: the docs name a parameter {name!r} it does not take"
        if default is not None:
            assert eval(default) == sig.parameters[name].default, (obj.__qualname__, name, default)


def test_hand_written_signatures_match_the_code():
    m = re.search(r"`mmpipe\.encode\(([^`]*)\) -> dict`", API)
    _check(mmpipe.encode, m.group(1))
    m = re.search(r"`mmpipe\.Collator\(([^`]*)\)` pads", RECORDS)
    _check(mmpipe.Collator, m.group(1))


def test_model_inputs_positions_are_all_named():
    """records.md's ``batch.model_inputs(...)`` lists every ``positions`` value the batch takes and
    its real default (None: the family's own, "mrope" for M-RoPE families, "1d" for the others)."""
    start = RECORDS.index("`batch.model_inputs(")
    text = RECORDS[start:RECORDS.index("\n\n", start)]
    assert "positions=None" in text, text
    doc_values = set(re.findall(r'"(\w+)"', text))
    assert {"mrope", "verl", "1d", "none"} <= doc_values, text
    assert inspect.signature(mmpipe.BatchedMultiModalInputs.model_inputs).parameters["positions"].default is None


def test_validate_exit_status_of_a_damaged_data_file_is_documented(tmp_path, capsys):
    """A truncated ``.arrow`` data file exits 2 (a damaged save, the user's to restore), like a
    damaged ``state.json``; docs/reference/cli.md listed only the latter for exit status 2."""
    import datasets

    from mmpipe.cli.main import main

    processor = mmpipe.testing.build_processor("qwen2_vl")
    raw = datasets.Dataset.from_list([{"prompt": "<image>What is it?", "images": [mmpipe.testing.tiny_image(32, 32)]}])
    enc, _ = mmpipe.encode_dataset(raw, processor)
    enc.save_to_disk(tmp_path / "enc")
    data = next((tmp_path / "enc").glob("*.arrow"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert main(["validate", str(tmp_path / "enc")]) == 2
    assert "damaged" in capsys.readouterr().err
    page = " ".join((ROOT / "docs" / "reference" / "cli.md").read_text().split())
    section = page[page.index("## mmpipe validate"):page.index("## mmpipe demo")]
    assert "truncated or corrupt `.arrow` / `.parquet` data file" in section, section


def _extras() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_extra_is_in_the_install_table_and_the_readme():
    """getting-started's extras table names every extra of pyproject.toml (the `cpu` extra was
    missing), with the packages it brings; the README's install comment names every integration
    extra (it listed 9 of 16)."""
    extras = _extras()
    page = (ROOT / "docs" / "getting-started.md").read_text()
    rows = re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|", page, flags=re.M)
    listed = {n: brings for cell, brings in rows for n in re.findall(r"`([\w-]+)`", cell)}
    assert set(extras) <= set(listed), f"extras missing from the install table: {sorted(set(extras) - set(listed))}"
    for name, brings in listed.items():
        if name in extras and name != "test":
            for req in extras[name]:
                package = re.split(r"[<>=\[ ]", req)[0]
                assert package in brings, (name, package, brings)
    readme = (ROOT / "README.md").read_text()
    comment = readme[readme.index("# extras per integration:"):readme.index("python -m mmpipe --help")]
    named = set(re.findall(r"[\w-]+", comment.replace("# extras per integration:", "").replace("#", " ")))
    missing = sorted(set(extras) - {"cpu"} - named)
    assert not missing, f"README's install comment does not name the extras {missing}"


def test_mmpipe_demo_usage_names_the_command_typed(capsys):
    """``mmpipe demo --help`` and its argument errors say ``mmpipe demo`` (the CLI page's command),
    not ``python -m mmpipe.cli.demo``; run as a module, the demo keeps its module name."""
    from mmpipe.cli import demo
    from mmpipe.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--rows", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mmpipe demo ") and "mmpipe demo: error: --rows must be at least 1" in err, err
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert capsys.readouterr().out.startswith("usage: mmpipe demo ")
    assert demo.parser().prog == "python -m mmpipe.cli.demo"


def test_errors_page_counts_the_bad_input_corpus():
    """docs/reference/errors.md's count of bad-input kinds is true of tests/bad_inputs.py (it said
    175 kinds where the corpus holds over 200): "N kinds" must be the count, "more than N
    kinds" a lower bound of it."""
    from bad_inputs import CASES, outcome_counts

    page = " ".join((ROOT / "docs" / "reference" / "errors.md").read_text().split())
    m = re.search(r"`tests/bad_inputs\.py` \((more than )?(\d+) kinds", page)
    assert m, "the errors page no longer says how many kinds the corpus holds"
    kinds = outcome_counts()["kinds"]
    assert kinds == len(CASES)
    assert (int(m.group(2)) < kinds) if m.group(1) else (int(m.group(2)) == kinds), (m.group(0), kinds)


def test_cli_page_names_every_offline_processor():
    """``--processor testing:NAME`` takes every name of `mmpipe.offline.builders.PROCESSOR_NAMES`
    (22: the Omni thinkers' among them, which the Audio guide uses); the CLI page listed the 8
    families' only."""
    from mmpipe.offline.builders import PROCESSOR_NAMES

    page = " ".join((ROOT / "docs" / "reference" / "cli.md").read_text().split())
    section = page[page.index("`--processor` takes"):page.index("A row that fails to encode")]
    missing = [n for n in PROCESSOR_NAMES if f"`{n}`" not in section]
    assert not missing, f"docs/reference/cli.md's --processor sentence lacks testing:{missing}"
    assert "local Hugging Face cache" in section  # a cached hub name loads too (never downloaded)


def test_video_options_row_names_every_field_and_its_default():
    """records.md's `video_options` row names every `VideoOptions` field (it lacked `video_start` /
    `video_end`, which the encoder takes) and the defaults it states are the dataclass's."""
    import dataclasses

    from mmpipe.images.video import VideoOptions

    row = next(line for line in RECORDS.splitlines() if line.startswith("| `video_options` |"))
    fields = {f.name: f.default for f in dataclasses.fields(VideoOptions)}
    missing = [name for name in fields if f"`{name}`" not in row]
    assert not missing, f"records.md's video_options row lacks {missing}"
    for name, default in re.findall(r"`(\w+)` \(([\d.]+)[:)]", row):
        assert float(default) == fields[name], (name, default, fields[name])
