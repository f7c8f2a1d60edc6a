"""`mmpipe.load_processor` on checkpoint directories as published and as users damage them:
every failure is a `ProcessorLoadError` naming the file and the fix, nothing loads silently wrong."""

import json
import shutil

import pytest

from mmpipe.processors import ProcessorLoadError, load_processor
from mmpipe.testing import build_processor


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen2_5_vl_saved")
    build_processor("qwen2_5_vl").save_pretrained(d)
    return d


@pytest.fixture
def folder(saved, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(saved, d)
    return d


def _edit(path, fn):
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def _v4_style(d, *, processor_class="Qwen2_5_VLProcessor"):
    """transformers 4.x layout: preprocessor_config.json, chat_template.json, no processor_config.json."""
    image = json.loads((d / "processor_config.json").read_text())["image_processor"]
    if processor_class:
        image["processor_class"] = processor_class
    (d / "preprocessor_config.json").write_text(json.dumps(image))
    (d / "processor_config.json").unlink()
    (d / "chat_template.json").write_text(json.dumps({"chat_template": (d / "chat_template.jinja").read_text()}))
    (d / "chat_template.jinja").unlink()
    _edit(d / "tokenizer_config.json", lambda o: o.pop("processor_class", None))


def _quiet(msg):
    pass


@pytest.mark.parametrize("name", ["processor_config.json", "tokenizer_config.json", "tokenizer.json", "config.json"])
def test_truncated_json_file_is_named(folder, name):
    f = folder / name
    text = f.read_text() if f.exists() else '{"model_type": "qwen2_5_vl"}'
    f.write_text(text[:20])
    with pytest.raises(ProcessorLoadError, match=rf"{name} is not valid JSON.*copy it again"):
        load_processor(folder, log=_quiet)


def test_missing_tokenizer_files_is_named(folder):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).unlink()
    with pytest.raises(ProcessorLoadError, match="no tokenizer files"):
        load_processor(folder, log=_quiet)


def test_missing_image_processor_config_is_named(folder):
    (folder / "processor_config.json").unlink()  # tokenizer_config.json still records the VL processor
    with pytest.raises(ProcessorLoadError, match="no image processor config.*preprocessor_config.json"):
        load_processor(folder, log=_quiet)


def test_image_processor_alone_is_refused(folder):
    _v4_style(folder, processor_class=None)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.json"):
        (folder / name).unlink()
    with pytest.raises(ProcessorLoadError, match="no tokenizer files"):
        load_processor(folder, log=_quiet)


def test_image_config_without_processor_class_is_not_loaded_as_bare_tokenizer(folder):
    _v4_style(folder, processor_class=None)  # AutoProcessor would return only the tokenizer
    with pytest.raises(ProcessorLoadError, match="built only the tokenizer.*processor_class"):
        load_processor(folder, log=_quiet)


def test_family_from_config_model_type_when_no_processor_class(folder):
    _v4_style(folder, processor_class=None)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    proc = load_processor(folder, log=_quiet)
    assert proc.image_processor is not None and proc.chat_template


def test_text_model_directory_loads_the_tokenizer(folder):
    (folder / "processor_config.json").unlink()
    _edit(folder / "tokenizer_config.json", lambda o: o.pop("processor_class", None))
    tok = load_processor(folder, log=_quiet)
    assert hasattr(tok, "convert_tokens_to_ids") and getattr(tok, "image_processor", None) is None


def test_chat_template_only_in_tokenizer_config(folder):
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    _edit(folder / "tokenizer_config.json", lambda o: o.update(chat_template=template))
    notes = []
    proc = load_processor(folder, log=notes.append)
    assert proc.chat_template == template and any("tokenizer_config.json" in n for n in notes)


def test_chat_template_list_of_named_templates(folder):
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    named = [{"name": "default", "template": template}, {"name": "tool_use", "template": "{{ messages }}"}]
    _edit(folder / "tokenizer_config.json", lambda o: o.update(chat_template=named))
    proc = load_processor(folder, log=_quiet)
    assert proc.chat_template["default"] == template


def test_empty_spec_does_not_load_the_working_directory(folder, monkeypatch):
    monkeypatch.chdir(folder)
    with pytest.raises(ProcessorLoadError, match="is empty"):
        load_processor("")


def test_testing_typo_suggests_the_name():
    with pytest.raises(ProcessorLoadError, match=r"did you mean testing:qwen2_5_vl\?"):
        load_processor("testing:Qwen2.5-VL")


def test_cached_hub_name_uses_the_directory_loader(saved, tmp_path, monkeypatch):
    """A cached Qwen-VL hub checkpoint loads like its directory (images-only fallback included)."""
    import huggingface_hub.constants as hf_constants

    snapshot = tmp_path / "hub" / "models--org--tiny-vl" / "snapshots" / ("0" * 40)
    shutil.copytree(saved, snapshot)
    _v4_style(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    proc = load_processor("org/tiny-vl", log=_quiet)
    assert proc.image_processor is not None
    with pytest.raises(ProcessorLoadError, match="not in the local Hugging Face cache"):
        load_processor("org/not-there", log=_quiet)
