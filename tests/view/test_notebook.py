"""notebooks/explore.ipynb runs top to bottom on the offline tiny models, and shows what it says.

The notebook is executed with nbclient in a real IPython kernel started from this test's
own interpreter (a kernelspec written to a temporary JUPYTER_PATH, so no kernel installed by
hand, and no other Python found on the machine, is used). Any cell error fails the test; the
outputs are then checked: the row and batch displays are HTML with the images (``<img>``
tags) and one span per image, the plots are PNG figures, the logprob check printed its gap.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "explore.ipynb"
KERNEL = "mmpipe-test-python"
CELL_TIMEOUT_S = 180


def _kernelspec(root: Path) -> None:
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "mmpipe test kernel", "language": "python",
    }))


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    root = tmp_path_factory.mktemp("jupyter")
    _kernelspec(root)
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root))
    mp.setenv("JUPYTER_PLATFORM_DIRS", "1")
    # connection files and the IPython profile in the temporary directory: nothing is
    # written to (or read from) the home directory, which may be read-only in CI
    mp.setenv("JUPYTER_RUNTIME_DIR", str(root / "runtime"))
    mp.setenv("IPYTHONDIR", str(root / "ipython"))
    mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # debugpy's frozen-modules warning
    try:
        nb = nbformat.read(str(NOTEBOOK), as_version=4)
        client = nbclient.NotebookClient(
            nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S, allow_errors=False,
            resources={"metadata": {"path": str(NOTEBOOK.parent)}},
        )
        client.execute()  # raises CellExecutionError naming the failing cell
    finally:
        mp.undo()
    return nb


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _cell(nb, snippet: str):
    hits = [c for c in _code_cells(nb) if snippet in c.source]
    assert len(hits) == 1, f"expected one code cell containing {snippet!r}, found {len(hits)}"
    return hits[0]


def _data(cell, mime: str) -> list[str]:
    out = []
    for o in cell.outputs:
        if o.output_type in ("execute_result", "display_data") and mime in o.get("data", {}):
            out.append(o["data"][mime])
    return out


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def test_stored_notebook_has_no_outputs():
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    nbformat.validate(nb)
    for c in _code_cells(nb):
        assert not c.outputs and c.execution_count is None, "commit the notebook with outputs cleared"


def test_every_cell_ran_in_order(executed):
    cells = _code_cells(executed)
    assert len(cells) >= 15
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1))
    for c in cells:
        assert not [o for o in c.outputs if o.output_type == "error"]
        stderr = "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream" and o.name == "stderr")
        assert "Traceback" not in stderr


def test_raw_rows_and_encoded_dataset(executed):
    raw = _data(_cell(executed, "raw = datasets.Dataset.from_dict"), "text/plain")
    assert raw and "num_rows: 4" in raw[0] and "'images'" in raw[0]
    enc = _data(_cell(executed, "mmpipe.encode,"), "text/plain")
    assert enc and "num_rows: 4" in enc[0]
    for col in ("input_ids", "position_ids", "image_grid_thw", "pixel_values_u8", "labels"):
        assert col in enc[0]


def test_row_display_shows_the_image_and_its_tokens(executed):
    html = _data(_cell(executed, "row = mmpipe.MultiModalInputs.from_dict"), "text/html")
    assert html, "the row did not display as HTML"
    h = html[0]
    assert h.count("<img") == 1 and "data:image/png;base64," in h  # row 0 holds one image
    assert h.count("mmpipe-image-span") >= 1
    with_text = _data(_cell(executed, "to_html(row, tokenizer=processor)"), "text/html")[0]
    # the token text instead of the ids: special tokens appear by name
    assert "<img" in with_text and "&lt;|im_start|&gt;" in with_text and "&lt;|im_start|&gt;" not in h
    described = _stdout(_cell(executed, "row.describe(tokenizer=processor)"))
    assert "image" in described and described.strip()


def test_batch_display_lists_every_row_and_image(executed):
    html = _data(_cell(executed, "batch = collator(rows)"), "text/html")
    assert html
    assert html[0].count("<img") == 4  # 1 + 0 + 2 + 1 images in the four rows
    assert "BatchedMultiModalInputs(" in _stdout(_cell(executed, "DataLoader(enc, batch_size=4, collate_fn=collator)"))
    shapes = _data(_cell(executed, "inputs = batch.model_inputs()"), "text/plain")[0]
    for key in ("pixel_values", "image_grid_thw", "mm_token_type_ids", "position_ids"):
        assert key in shapes
    assert "(3, 4, " in shapes  # M-RoPE positions [3, B, L]
    assert "loss over the answer tokens" in _stdout(_cell(executed, "out = model(**inputs)"))


def test_rollout_samples_and_policy_batch(executed):
    samples = _data(_cell(executed, "samples = unbatch_rollout"), "text/plain")[0]
    assert samples.count("RolloutSample(") == 4  # 2 prompts x n=2
    assert _data(_cell(executed, "samples[0]"), "text/html")
    policy = _data(_cell(executed, "policy = mmpipe.collate"), "text/html")
    assert policy and policy[0].count("<img") >= 2
    printed = _stdout(_cell(executed, "teacher_forced_logprobs(model, policy)"))
    assert "max |rollout - training| logprob gap" in printed


def test_plots_are_figures(executed):
    for snippet in ("plot_positions(row)", "plot_image_grid(row, image_index=0)", "plot_positions(policy, index=0)"):
        pngs = _data(_cell(executed, snippet), "image/png")
        assert len(pngs) == 1, f"{snippet}: expected one PNG figure, found {len(pngs)}"
