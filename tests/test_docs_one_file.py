"""The documents' claims that adding a decoder, a metric or a study is one file, each held in a
temporary copy of the checkout: the code block the document shows is saved where the document says
(read from the document itself, so that the two cannot drift), and nothing else is edited. In the copy
the documents' module lists and the layers still hold (tests/test_docs_module_lists.py and
tests/test_layers.py run there), and a fresh process with the copy first on its path finds the new
name in its registry and uses it: the decoder is built through the factory, runs a forward pass and a
greedy decode; the metric is listed by `hmer models` and scores predictions; the study's `--help` runs
through `hmer study NAME` and its spec's cells resolve to configs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
STUDIES = ROOT / "docs" / "studies.md"
# What the copy needs: the package and the tools (whose imports the layers hold too), the documents whose
# lists are held to them, and the tests that hold them.
COPIED = ("src/hmer", "tools", "docs/architecture.md", "docs/studies.md", "tests/package_imports.py",
          "tests/test_docs_module_lists.py", "tests/test_layers.py")


def the_change(document: Path, section: str) -> tuple[str, str]:
    """(path, code) of the one change that section `section` of `document` shows: the file it names
    ("saved as `src/hmer/...`", or "added at the end of" one) and the first Python block after it."""
    text = document.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"(saved as|added at the end of)\s+`(src/hmer/[\w/]+\.py)`.*?```python\n(.*?)```", text, re.S)
    assert found, f"{document.name}, {section!r}: no file named before a Python block"
    return found.group(2), found.group(3)


@pytest.fixture
def copy(tmp_path) -> Path:
    """A copy of what the lists and the package need (COPIED), in the same places."""
    for relative in COPIED:
        source, target = ROOT / relative, tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path


def _run(copy: Path, *args: str) -> str:
    """`python ARGS` in the copy, with its package first on the path; its stdout (fails on an error)."""
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"python {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _lists_hold(copy: Path) -> None:
    """The module lists and the layers, tested in the copy (its own files only: no ini, no conftest)."""
    _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(copy),
         "tests/test_docs_module_lists.py", "tests/test_layers.py")


def _add(copy: Path, path: str, code: str, *, append: bool = False) -> None:
    target = copy / path
    assert target.exists() == append, f"{path} {'is not' if append else 'is'} in the package already"
    target.write_text((target.read_text() + "\n" if append else "") + code)


# Each script runs in a fresh process of the copy, given the new name and the copy's package folder.
DECODER_USE = """
import json, sys
import torch
import hmer
from hmer.decoding import decode_batch
from hmer.model import build_model, make_targets
from hmer.model_presets import preset_with_recipe
from hmer.registry import DECODERS

name, package = sys.argv[1:]
assert hmer.__file__.startswith(package), hmer.__file__
cfg = preset_with_recipe("tiny-transformer").override({"model.decoder": name})  # validated against the registry
model = build_model(cfg).eval()
torch.manual_seed(0)
images, mask = torch.rand(2, 1, 32, 48), torch.zeros(2, 32, 48, dtype=torch.bool)
tgt_in, _, _ = make_targets([[5, 6, 7], [8]], "l2r")
with torch.no_grad():
    logits = model(images, mask, tgt_in)
    greedy = decode_batch(model, images, mask, "l2r", beam_size=1, max_len=4)
print(json.dumps({"registered": name in DECODERS, "module": type(model.decoder).__module__,
                  "logits": list(logits.shape), "tgt_in": list(tgt_in.shape), "vocab": cfg.model.vocab_size,
                  "greedy": [len(ids) for ids in greedy]}))
"""

METRIC_USE = """
import json, sys
import hmer
from hmer.cli import main
from hmer.evaluation import expression_metrics
from hmer.registry import METRICS

name, package = sys.argv[1:]
assert hmer.__file__.startswith(package), hmer.__file__
# token edit distances 3, 0 and 7
scores = expression_metrics([["a", "b", "c", "d"], ["x"], list("abcdefg")], [["a"], ["x"], ["z"]])
print(json.dumps({"registered": name in METRICS, "score": scores.extra.get(name),
                  "logged_as": sorted(scores.as_dict("test_2014"))}))
main(["models"])
"""

STUDY_USE = """
import json, sys
import hmer
import hmer.studies
from hmer.studies import STUDIES, ablations, get_budget
from hmer.studies.resolution import cell_resolution, study_resolution

name, package = sys.argv[1:]
assert hmer.__file__.startswith(package), hmer.__file__
spec = STUDIES.get(name)
cells = spec.cells([0, 1])
base = study_resolution(spec, get_budget("smoke"), n_trials=len(cells), n_jobs=1)
resolved = [cell_resolution(base, spec, cell) for cell in cells]
print(json.dumps({"found": spec.name == name, "grid": name in ablations(),
                  "cells": [{key: cell[key] for key in spec.axes} for cell in cells],
                  "trained": [{key: r.config.to_flat_dict()[key] for key in spec.axes} for r in resolved],
                  "layers": sorted({r.sources[key].split()[0] for r in resolved for key in spec.axes})}))
"""


def test_a_decoder_is_one_file(copy):
    path, code = the_change(ARCHITECTURE, "Add a decoder in one file")
    name = re.search(r'DECODERS\.register\("([\w-]+)"', code).group(1)
    _add(copy, path, code)
    _lists_hold(copy)
    used = json.loads(_run(copy, "-c", DECODER_USE, name, str(copy / "src" / "hmer")).splitlines()[-1])
    assert used["registered"] and used["module"] == "hmer." + path.removeprefix("src/hmer/")[:-3].replace("/", ".")
    assert used["logits"] == [*used["tgt_in"], used["vocab"]]  # teacher forcing: [B, L, V]
    assert len(used["greedy"]) == 2 and all(n <= 4 for n in used["greedy"])


def test_a_metric_is_one_file(copy):
    path, code = the_change(ARCHITECTURE, "Add a metric in one file")
    name = re.search(r'METRICS\.register\("([\w-]+)"', code).group(1)
    description = re.search(r'description="([^"]+)"', code).group(1)
    _add(copy, path, code, append=True)
    _lists_hold(copy)
    out = _run(copy, "-c", METRIC_USE, name, str(copy / "src" / "hmer"))
    used = json.loads(out.splitlines()[0])
    assert used["registered"] and f"test_2014_{name}" in used["logged_as"]
    assert used["score"] == pytest.approx(200 / 3)  # the doc's metric, within three edits: 2 of 3
    listed = re.search(rf"^(metric)?\s+{re.escape(name)}\s+{re.escape(description)}$", out, re.M)
    assert listed, f"`hmer models` does not list {name} with its description:\n{out}"


def test_a_study_is_one_file(copy):
    path, code = the_change(STUDIES, "Add a study in one file")
    name = Path(path).stem
    _add(copy, path, code)
    _lists_hold(copy)
    help_text = _run(copy, "-m", "hmer.cli", "study", name, "--help")
    docstring = re.match(r'"""(.+?)"""', code, re.S).group(1)
    assert " ".join(docstring.split()) in " ".join(help_text.split()), help_text
    used = json.loads(_run(copy, "-c", STUDY_USE, name, str(copy / "src" / "hmer")).splitlines()[-1])
    assert used["found"] and used["grid"]
    assert used["trained"] == used["cells"] and len(used["cells"]) >= 4  # two seeds of at least two variants
    assert used["layers"] == ["cell"]
