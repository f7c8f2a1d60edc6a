"""Every dotted ``mmpipe.x.y`` name the README uses resolves by attribute access alone after a
plain ``import mmpipe`` (subpackages and their modules load on first use, `mmpipe._lazy`), in a
fresh interpreter, and ``import mmpipe`` itself stays light (no torch, transformers, datasets,
vLLM, Ray, openai, cosmos-rl).

tests/test_readme.py resolves the same names by importing each prefix; this checks what a user
typing ``mmpipe.processors.load_processor(...)`` after ``import mmpipe`` gets.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the README and the docs pages it moved into (docs/**/*.md; `::: name` lines are mkdocstrings directives)
README = re.sub(r"(?m)^::: .*$", "", "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]))
# a name is a dotted path of identifiers; a sentence's full stop after it is not part of it
README_NAMES = sorted({n.rstrip(".") for n in re.findall(r"\bmmpipe(?:\.[A-Za-z_]\w*)+", README)})
# what `import mmpipe` must not import (optional integrations and the heavy stacks load on use)
HEAVY = ("torch", "transformers", "datasets", "vllm", "ray", "openai", "cosmos_rl", "gymnasium", "matplotlib")
# resolving a README name may import torch/transformers (rollout engines), never these
OPTIONAL = ("vllm", "ray", "openai", "cosmos_rl")

# Each name is resolved in a child forked right after `import mmpipe` (the same state as a fresh
# interpreter that ran only `import mmpipe`), so no name resolves because an earlier one loaded it.
_PROBE = textwrap.dedent("""
    import json, os, sys
    import mmpipe

    NAMES, OPTIONAL = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))

    def resolve(name):
        obj = mmpipe
        for part in name.split(".")[1:]:
            obj = getattr(obj, part)
        return sorted({m.split(".")[0] for m in sys.modules} & OPTIONAL)

    results = {}
    for name in NAMES:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                out = {"ok": True, "optional": resolve(name)}
            except BaseException as e:
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            os.write(w, json.dumps(out).encode())
            os._exit(0)
        os.close(w)
        chunks = []
        while True:
            b = os.read(r, 65536)
            if not b:
                break
            chunks.append(b)
        os.close(r)
        os.waitpid(pid, 0)
        results[name] = json.loads(b"".join(chunks) or b'{"ok": false, "error": "child died"}')
    print(json.dumps(results))
""")


def _run(code: str, *args: str) -> str:
    run = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.fixture(scope="module")
def resolved() -> dict:
    out = _run(_PROBE, json.dumps(README_NAMES), json.dumps(OPTIONAL))
    return json.loads(out.strip().splitlines()[-1])


def test_the_readme_names_many_dotted_names():
    assert len(README_NAMES) >= 80
    assert "mmpipe.processors.load_processor" in README_NAMES and "mmpipe.rollout.packers.QwenVLDataPacker" in README_NAMES


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_readme_name_resolves_by_attribute_after_import_mmpipe(resolved):
    import importlib

    def host_class(name: str) -> bool:  # built from a host's classes on first access (`HOST_CLASSES`)
        module, _, attr = name.rpartition(".")
        return attr in getattr(importlib.import_module(module), "HOST_CLASSES", ())

    broken = {name: r["error"] for name, r in resolved.items()
              if not r["ok"] and not (r["error"].startswith("ImportError") and host_class(name))}
    assert not broken, "\n".join(f"{k}: {v}" for k, v in sorted(broken.items()))
    assert set(resolved) == set(README_NAMES)


def test_resolving_a_readme_name_imports_no_optional_integration(resolved):
    pulled = {name: r["optional"] for name, r in resolved.items() if r["ok"] and r["optional"]}
    assert not pulled, pulled


def test_import_mmpipe_stays_light():
    out = _run("import sys, mmpipe; print(sorted({m.split('.')[0] for m in sys.modules}))")
    loaded = set(eval(out.strip().splitlines()[-1]))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_subpackages_load_on_first_use_only():
    code = ("import sys, mmpipe; before = 'mmpipe.rollout' in sys.modules; r = mmpipe.rollout; "
            "print(before, 'mmpipe.rollout' in sys.modules, r is sys.modules['mmpipe.rollout'], "
            "'rollout' in dir(mmpipe), 'rollout' in mmpipe.__all__)")
    assert _run(code).split() == ["False", "True", "True", "True", "False"]


def test_a_missing_name_is_an_attribute_error_naming_it():
    code = textwrap.dedent("""
        import mmpipe
        for obj, name in ((mmpipe, "no_such_name"), (mmpipe.images, "no_such_module"), (mmpipe.data, "nope"),
                          (mmpipe.rollout, "nope"), (mmpipe.reward, "nope")):
            try:
                getattr(obj, name)
            except AttributeError as e:
                print(repr(name) in str(e), hasattr(obj, name))
    """)
    assert _run(code).split() == ["True", "False"] * 5


def test_a_package_loaded_as_a_side_effect_reaches_its_modules_too():
    # mmpipe.media is imported by encode's machinery, not through mmpipe.__getattr__
    code = ("import importlib, mmpipe; importlib.import_module('mmpipe.media.patches'); "
            "print(mmpipe.media.tiles_view.__name__, mmpipe.offline.ovis2.__name__)")
    assert _run(code).split() == ["mmpipe.media.tiles_view", "mmpipe.offline.ovis2"]


def test_functions_that_read_mmpipe_still_pickle_and_hash():
    # datasets fingerprints (dill) and num_proc workers pickle a map function's globals: the
    # mmpipe module (of class SubmoduleAccess) pickles by reference, as a plain module does
    import dill
    from datasets.fingerprint import Hasher

    import mmpipe

    def uses_mmpipe(row):
        return {"x": mmpipe.IGNORE_INDEX}

    assert dill.loads(dill.dumps(mmpipe)) is mmpipe
    assert dill.loads(dill.dumps(uses_mmpipe, recurse=True))({}) == {"x": -100}
    assert Hasher.hash(uses_mmpipe) == Hasher.hash(uses_mmpipe)
