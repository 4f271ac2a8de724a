"""docs/walkthrough.ipynb: it runs top to bottom without a cell error, and git holds it without outputs."""
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "docs", "walkthrough.ipynb")


def test_notebook_is_stored_without_outputs():
    with open(NOTEBOOK) as f:
        nb = json.load(f)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)


def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' brings nbclient and ipykernel")
    nbclient = pytest.importorskip("nbclient")
    if not os.path.exists(os.path.join(ROOT, "data", "tinyshakespeare.txt")):       # the notebook would download it
        pytest.skip("data/tinyshakespeare.txt is missing (.ci/run copies it; the training script downloads it)")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("TMPDIR", str(tmp_path))                   # the kernel's run and report go there
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",   # a cell's error (an assert too) raises
                            resources={"metadata": {"path": os.path.join(ROOT, "docs")}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert text.count("max |library - hand|") == 4 and text.count("finite difference") == 4
    assert "ROMEO:" in text and "report.html" in text and os.listdir(tmp_path)
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1                                       # the loss curve
