"""The training-code fingerprint (hmer.training.fingerprint): the same code gives the same one, a
change of what training computes changes it, and a change elsewhere does not."""

from __future__ import annotations

import shutil
from pathlib import Path


from hmer.training.fingerprint import code_fingerprint, fingerprint_of_source

REPO = Path(__file__).resolve().parents[1]
ATTENTION = "torch.matmul(q * (1.0 / math.sqrt(self.head_dim)), k.transpose(-2, -1))"


def _source_copy(tmp_path: Path, name: str) -> Path:
    src = tmp_path / name / "src"
    shutil.copytree(REPO / "src" / "hmer", src / "hmer", ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_one_operation_s_rounding_changes_the_fingerprint_and_a_report_s_edit_does_not(tmp_path, monkeypatch):
    today = code_fingerprint()
    assert len(today) == 16 and int(today, 16) >= 0

    # The same formula in another order: the scale applied to the scores instead of the queries.
    reordered = _source_copy(tmp_path, "reordered")
    attention = reordered / "hmer" / "model" / "attention.py"
    assert ATTENTION in attention.read_text()
    attention.write_text(attention.read_text().replace(
        ATTENTION, "torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)"))
    changed, measured = fingerprint_of_source(reordered)
    assert changed != today
    assert set(measured["parts"]) == {"transformer-bi", "comer-fusion", "rnn", "convs2s"}
    assert all(not part["unknown"] and len(part["losses"]["train_loss"]) == 2 for part in measured["parts"].values())

    # Nothing that trains: the reports' tables.
    edited = _source_copy(tmp_path, "edited")
    tables = edited / "hmer" / "reports" / "tables.py"
    tables.write_text(tables.read_text() + "\n# a comment and a constant that nothing trains with\nUNUSED = 1\n")
    # measured as rank 0 of torchrun measures it, with the launcher's variables: the measuring child
    # is one process (it read them once, and waited for a rank 1 that never came)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29577", "TORCHELASTIC_RUN_ID": "fingerprint-test"}.items():
        monkeypatch.setenv(key, value)
    assert fingerprint_of_source(edited, timeout=600)[0] == today
