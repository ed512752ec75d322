"""The documented example runs FedBN on a user's own MONAI network and data, tracked in MLflow."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "own_model.py"


def code_lines(path: Path) -> int:
    """Count the lines that hold code: no blank, comment-only or docstring line."""
    source = path.read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source), clean=False)
    doc_lines = set()
    if doc is not None:
        node = ast.parse(source).body[0]
        doc_lines = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - doc_lines)


def test_the_example_is_at_most_15_lines_of_public_names() -> None:
    assert code_lines(EXAMPLE) <= 15, code_lines(EXAMPLE)
    tree = ast.parse(EXAMPLE.read_text(encoding="utf-8"))
    ours = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            and "fedbn_med" in (getattr(n, "module", None) or n.names[0].name)]
    assert [n.names[0].name for n in ours] == ["fedbn_med"]  # no deep import
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "fb"}
    import fedbn_med

    assert used <= set(fedbn_med.__all__), used - set(fedbn_med.__all__)


def _site(folder: Path, brightness: float, rng: np.random.Generator) -> Path:
    """Write a site's PNGs (a bright square is the finding) and its datalist."""
    folder.mkdir()
    lists: dict[str, list[dict[str, object]]] = {"training": [], "validation": [], "test": []}
    for split, n in (("training", 8), ("validation", 4), ("test", 4)):
        for i in range(n):
            label = i % 2
            image = rng.normal(60 * brightness, 10, (32, 32))
            if label:
                image[10:20, 10:20] += 120
            name = f"{split}{i}.png"
            Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(folder / name)
            lists[split].append({"image": name, "label": label})
    path = folder / "datalist.json"
    path.write_text(json.dumps(lists))
    return path


def test_the_example_runs_fedbn_and_tracks_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lists = [_site(tmp_path / name, b, rng) for name, b in (("a", 1.0), ("b", 1.8))]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}
    args = [f"{p.parent.name}={p}" for p in lists]
    done = subprocess.run([sys.executable, str(EXAMPLE), uri, *args], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.split("MLflow run:")[1].split()[0]
    shared = Path(done.stdout.split("shared weights:")[1].split()[0])
    assert shared.is_file()
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(run_id)
    assert parent.data.params["strategy"] == "fedbn"
    assert parent.data.tags["task"] == "own-model"
    assert "selected_round" in parent.data.metrics
    artifacts = [a.path for a in client.list_artifacts(run_id, "model/selected")]
    assert artifacts == ["model/selected/shared_weights.safetensors"]
    # one child run per site, each with its per-round validation AUC
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{run_id}'")
    assert sorted(c.data.tags["mlflow.runName"] for c in children) == ["site-a", "site-b"]
    for child in children:
        assert len(client.get_metric_history(child.info.run_id, "val_auc")) == 2
