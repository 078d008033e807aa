"""colab/prompt_weighting.ipynb and colab/passk_diagnostics.ipynb run at smoke size.

nbclient/ipykernel are not dependencies, so the code cells are executed in order with
exec in one namespace (what a kernel does), with the Agg backend.
"""

import json
import os
import shutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _code_cells(name):
    with open(os.path.join(REPO, "colab", name)) as f:
        nb = json.load(f)
    assert nb["nbformat"] == 4 and nb["cells"]
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and "execution_count" in cell
            cells.append("".join(cell["source"]))
    code = "\n".join(cells)
    assert "._" not in code.replace("os.path._", "")  # public API only
    return cells


def _run(cells, monkeypatch, tmp_path):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)
    os.symlink(os.path.join(REPO, "experiments"), tmp_path / "experiments")
    namespace = {"__name__": "__notebook__"}
    import matplotlib

    matplotlib.use("Agg")
    for source in cells:
        exec(compile(source, "<cell>", "exec"), namespace)
    return namespace


def test_prompt_weighting_notebook_runs(monkeypatch, tmp_path):
    ns = _run(_code_cells("prompt_weighting.ipynb"), monkeypatch, tmp_path)
    # MaxRL (w = 1/p) gives the rare-success prompt the largest advantages, LOO is symmetric.
    assert ns["scale"]["maxrl"][0] > ns["scale"]["maxrl"][2] > ns["scale"]["maxrl"][-1]
    assert abs(ns["scale"]["loo"][0] - ns["scale"]["loo"][-1]) < 1e-6
    assert len(ns["snapshots"]) == 3


def test_passk_diagnostics_notebook_runs(smoke_run, monkeypatch, tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(smoke_run, workdir)
    monkeypatch.setenv("JAXRL_VR_EVAL_WORKDIR", str(workdir))
    monkeypatch.setenv("JAXRL_VR_EVAL_SAMPLES", "8")
    ns = _run(_code_cells("passk_diagnostics.ipynb"), monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert ns["ev"]["n"] == 8 and ns["ev"]["inversion"] is not None
    assert "lost" in out and "newly_solved" in out and "expected by chance" in out
    assert set(ns["images"]) == {"passk.png", "delta_by_regime.png", "prompt_scatter.png"}
