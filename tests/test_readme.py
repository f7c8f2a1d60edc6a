"""The README and the docs site (docs/**/*.md) say what works: every ```python block on every
page runs as written, each in a fresh namespace (no block relies on a name it does not define),
every import and dotted ``mmpipe.x.y`` name they mention resolves, every file path they name
exists, the errors page names every typed error, the CLI page every subcommand; and (in the
``docs`` environment, scripts/envs/docs.sh) the built site's pages load in headless Chromium
without a console error.

A block that needs another environment's packages says so in an HTML comment on the line
above its fence, ``<!-- block: env=NAME -->`` (NAME: a scripts/envs/NAME.sh environment); it
runs there, through the ``needs_env`` marks below, and `test_block_inventory` counts and
reports it in the main run. No block is skipped: each runs in exactly one environment."""

from __future__ import annotations

import ast
import importlib
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
ANNOTATION = re.compile(r"<!-- block: (?P<note>[^>]*?) -->\s*$")

# One mark per environment, written out so that scripts/envs/_common.bash's marked_tests (a
# grep for needs_env("NAME")) hands this file to every environment that has blocks to run.
ENV_MARKS = {
    "main": pytest.mark.needs_env("main"),
    "docs": pytest.mark.needs_env("docs"),
    "verl": pytest.mark.needs_env("verl"),
    "cosmos": pytest.mark.needs_env("cosmos"),
    "vllm": pytest.mark.needs_env("vllm"),
    "tf457": pytest.mark.needs_env("tf457"),
    "vision": pytest.mark.needs_env("vision"),
}
MAIN = ENV_MARKS["main"]


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # the fence's line, 1-based
    code: str
    env: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    for path in PAGES:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            env = "main"
            note = ANNOTATION.search(before)
            if note:
                key, _, value = note.group("note").partition("=")
                assert key == "env" and value, f"{path.name}:{line}: unknown block annotation {note.group(0)!r}"
                env = value
            out.append(Block(str(path.relative_to(ROOT)), line, textwrap.dedent(m.group("body")), env))
    return out


BLOCKS = _blocks()
TEXT = "\n".join(p.read_text() for p in PAGES)


def _param(block: Block):
    return pytest.param(block, id=block.id, marks=ENV_MARKS.get(block.env, pytest.mark.needs_env(block.env)))


# ---- every block runs ------------------------------------------------------------------------
@MAIN
def test_block_inventory(capsys):
    """Counts the blocks per page and environment and reports them; every environment a block
    names exists (scripts/envs/NAME.sh) and has a mark above."""
    assert len(BLOCKS) >= 30, len(BLOCKS)
    by_env: dict[str, list[str]] = {}
    for b in BLOCKS:
        by_env.setdefault(b.env, []).append(b.id)
    for env in by_env:
        assert env in ENV_MARKS, f"block environment {env!r} has no mark in ENV_MARKS"
        assert env == "main" or (ROOT / "scripts" / "envs" / f"{env}.sh").exists(), env
    pages = {b.page for b in BLOCKS}
    with capsys.disabled():
        print(f"\n[docs blocks] {len(BLOCKS)} python blocks on {len(pages)} pages: "
              + ", ".join(f"{env} {len(ids)}" for env, ids in sorted(by_env.items())))
        for env, ids in sorted(by_env.items()):
            if env != "main":
                print(f"[docs blocks] run in scripts/envs/{env}.sh: {' '.join(ids)}")


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_block_runs_as_written(block, tmp_path, monkeypatch):
    """The block, exactly as on the page, in a fresh namespace and a scratch working directory."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs_block__"}
    environ = dict(os.environ)  # a block may set variables (the S3 endpoint): they end with it
    try:
        exec(compile(block.code, block.id, "exec"), namespace)
    finally:
        os.environ.clear()
        os.environ.update(environ)


# ---- names the pages mention -------------------------------------------------------------------
def _imports():
    for b in BLOCKS:
        for node in ast.walk(ast.parse(b.code)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mmpipe":
                yield node.module, tuple(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "mmpipe":
                        yield a.name, ()


@MAIN
@pytest.mark.parametrize("module, names", sorted(set(_imports())))
def test_every_import_resolves(module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), f"from {module} import {name}"


def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            obj = importlib.import_module(".".join(parts[: i + 1]))
    return obj


# `::: mmpipe.x` lines are mkdocstrings directives (checked by the strict build)
_DOTTED = sorted(set(re.findall(r"(?<![:/\w])mmpipe(?:\.[A-Za-z_]\w*)+", re.sub(r"(?m)^::: .*$", "", TEXT))))


@MAIN
@pytest.mark.parametrize("dotted", _DOTTED)
def test_every_dotted_name_exists(dotted):
    """A class a host module builds from the host's own classes (``HOST_CLASSES``) exists where its
    module declares it; it resolves in the host's environment (its docs blocks run there)."""
    try:
        _resolve(dotted.rstrip("."))
    except ImportError as e:
        module, _, name = dotted.rstrip(".").rpartition(".")
        assert name in getattr(importlib.import_module(module), "HOST_CLASSES", ()), e


@MAIN
@pytest.mark.parametrize("path", sorted(set(re.findall(r"`((?:mmpipe|tests|scripts|bench|notebooks|docs)/[\w/.-]*)`", TEXT))))
def test_every_path_exists(path):
    assert (ROOT / path).exists(), path


# ---- reference pages that must stay complete -----------------------------------------------------
@MAIN
def test_errors_page_names_every_typed_error():
    import inspect

    from mmpipe import errors

    page = (ROOT / "docs" / "reference" / "errors.md").read_text()
    classes = [n for n, c in vars(errors).items()
               if inspect.isclass(c) and issubclass(c, Exception) and c.__module__ == errors.__name__]
    assert len(classes) >= 10
    missing = [n for n in classes if f"`{n}`" not in page]
    assert not missing, f"docs/reference/errors.md does not describe {missing}"


@MAIN
def test_cli_page_names_every_subcommand():
    """`python -m mmpipe --help` works (no venv activation needed) and the CLI page describes
    every subcommand it lists."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mmpipe", "--help"], capture_output=True, text=True, check=True).stdout
    names = re.search(r"\{([\w,-]+)\}", out).group(1).split(",")
    assert len(names) >= 4, out
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    missing = [n for n in names if f"mmpipe {n}" not in page]
    assert not missing, f"docs/reference/cli.md does not describe {missing}"


@MAIN
def test_readme_first_screen():
    """The README stays short: install, one example, audio, the two commands, links into the docs."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120, len(readme.splitlines())
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    first = [b for b in BLOCKS if b.page == "README.md"]
    # the first example, and the Audio section's (issue 31)
    assert len(first) == 2 and all(len(b.code.strip().splitlines()) <= 20 for b in first)
    for page in re.findall(r"\]\((docs/[\w/.-]+\.md)", readme):
        assert (ROOT / page).exists(), page


# ---- the built site in a browser (scripts/envs/docs.sh) -------------------------------------------
def _site(tmp_path_factory) -> Path:
    """The site docs.sh built (MMPIPE_DOCS_SITE), or a strict build into a temporary folder."""
    if os.environ.get("MMPIPE_DOCS_SITE"):
        return Path(os.environ["MMPIPE_DOCS_SITE"])
    import subprocess
    import sys

    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
                   cwd=ROOT, check=True)
    return site


@ENV_MARKS["docs"]
def test_site_pages_load_in_headless_chromium(tmp_path_factory):
    """Every built page, served over HTTP, loads in Debian's chromium (Playwright drives it)
    with no console error, no uncaught exception and no failed request."""
    import functools
    import http.server
    import shutil
    import threading

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(chromium).exists(), "no chromium: apt-get install chromium (scripts/envs/docs.sh does)"
    site = _site(tmp_path_factory)
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) >= 15, pages
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    problems: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            current = [""]
            page.on("console", lambda m: m.type == "error" and problems.append(f"{current[0]}: console: {m.text}"))
            page.on("pageerror", lambda e: problems.append(f"{current[0]}: exception: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"{current[0]}: request failed: {r.url}"))
            for rel in pages:
                current[0] = rel
                response = page.goto(base + rel, wait_until="networkidle")  # every request done
                assert response is not None and response.ok, (rel, response and response.status)
                assert page.locator("article h1").count() >= 1, f"{rel}: no page title rendered"
            browser.close()
    finally:
        server.shutdown()
    assert not problems, "\n".join(problems)


@MAIN
def test_encode_options_table_lists_every_encoder_argument():
    """The options table of docs/concepts/records.md names every `mmpipe.Encoder` argument."""
    import inspect

    import mmpipe

    page = (ROOT / "docs" / "concepts" / "records.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", page, flags=re.M))
    listed = {name for pair in listed for name in pair if name}
    params = [p for p in inspect.signature(mmpipe.Encoder.__init__).parameters if p not in ("self", "processor")]
    missing = [p for p in params if p not in listed]
    assert not missing, f"docs/concepts/records.md's encode options table lacks {missing}"


@MAIN
def test_pipeline_page_names_every_package():
    """docs/concepts/pipeline.md's folder table names every package folder of mmpipe."""
    page = (ROOT / "docs" / "concepts" / "pipeline.md").read_text()
    folders = sorted(p.name for p in (ROOT / "mmpipe").iterdir() if (p / "__init__.py").exists())
    missing = [f for f in folders if f"`mmpipe/{f}/`" not in page]
    assert not missing, f"docs/concepts/pipeline.md's folder table lacks {missing}"


@MAIN
def test_errors_page_names_every_error_class_in_the_source():
    """Error classes defined outside mmpipe/errors.py (ProcessorLoadError, SchemaError, ...) are
    on the errors page too: any class deriving from a documented error, found in the source."""
    page = (ROOT / "docs" / "reference" / "errors.md").read_text()
    known = {"MMPipeError", "ArgumentError", "InputError"}
    defs = re.findall(r"^class (\w+)\(([\w, .]+)\)", "\n".join(p.read_text() for p in (ROOT / "mmpipe").rglob("*.py")),
                      flags=re.M)
    grew = True
    while grew:
        grew = False
        for name, bases in defs:
            if name not in known and any(b.strip().split(".")[-1] in known for b in bases.split(",")):
                known.add(name)
                grew = True
    missing = sorted(n for n in known if f"`{n}`" not in page)
    assert not missing, f"docs/reference/errors.md does not describe {missing}"


@MAIN
def test_performance_tables_are_generated_from_the_bench_json():
    """docs/hooks/bench_tables.py turns every bench JSON the Performance page names into a table
    with one row per case (per family and backend for the vLLM gaps); a missing file fails."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_tables", ROOT / "docs" / "hooks" / "bench_tables.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "performance.md").read_text()
    names = hook.MARKER.findall(page)
    assert names, "the Performance page names no bench JSON"
    out = hook.on_page_markdown(page, None, None, None)
    assert "<!-- bench:" not in out
    for name in names:
        data = json.loads((hook.DATA / f"{name}.json").read_text())
        expected = len(data["results"]) if "results" in data else sum(len(g["backends"]) for g in data.values())
        table = hook.render(name)
        rows = [line for line in table.splitlines() if line.startswith("|")]
        assert len(rows) - 2 == expected, (name, expected)  # the header and its separator excluded
    with pytest.raises(FileNotFoundError):
        hook.render("no-such-run")
