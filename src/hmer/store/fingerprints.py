"""`hmer runs fingerprint`: the training-code fingerprint of every run that was trained before runs
carried one, measured at the commit that trained it.

A run trained today carries the fingerprint of its code (`hmer.fingerprint`, hmer.training.fingerprint).
Older runs name only their commit (`hmer.git_commit`). For each such commit, a detached worktree of
it is made in a temporary folder, the fixed training of `hmer.training.fingerprint` runs against its
`src/` (this checkout's script, that commit's package), the runs of that commit are tagged, and the
worktree goes. A commit that is not in the clone, or a run trained from uncommitted changes
(`-dirty`), gets "unknown: why" instead: nothing else can say what that code computed.

    done = record_fingerprints("sqlite:///mlruns/mlflow.db", repo=Path("."))   # {commit: fingerprint}

Runs whose fingerprints are equal were trained by code that computes the same numbers; `hmer report`
marks the runs whose fingerprint is not today's, and a study copies a trained cell only from a run
with today's (hmer.studies.reuse).
"""

from __future__ import annotations

import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Callable

from ..tracking import keys
from ..tracking.store import search_all_runs
from ..training.fingerprint import code_fingerprint, fingerprint_of_source

UNKNOWN = "unknown: "


def trained_runs_without_fingerprint(client) -> dict[str, list[str]]:
    """{commit: run ids} of the runs in the store that were trained here (a commit tag, not imported,
    not a study's own parent or summary run) and carry no fingerprint yet."""
    runs = search_all_runs(client, deleted_too=True)
    by_commit: dict[str, list[str]] = defaultdict(list)
    for run in runs:
        tags = run.data.tags
        if keys.GIT_COMMIT not in tags or keys.FINGERPRINT in tags or keys.ROLE in tags:
            continue
        if keys.IMPORT_SOURCE in tags:  # a reference checkpoint imported (`hmer import`): not trained here
            continue
        by_commit[tags[keys.GIT_COMMIT]].append(run.info.run_id)
    return dict(by_commit)


def fingerprint_of_commit(commit: str, repo: Path) -> str:
    """The fingerprint of the training code at `commit` of the clone `repo`, or "unknown: why"."""
    if commit.endswith("-dirty"):
        return f"{UNKNOWN}trained from uncommitted changes to {commit.removesuffix('-dirty')[:7]}"
    known = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        return f"{UNKNOWN}commit {commit[:7]} is not in this clone"
    with tempfile.TemporaryDirectory(prefix="hmer-fingerprint-wt-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(tree), commit],
                       check=True, capture_output=True)
        try:
            return fingerprint_of_source(tree / "src")[0]
        except RuntimeError as exc:
            return f"{UNKNOWN}{str(exc).splitlines()[0]}"
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)


def record_fingerprints(tracking_uri: str, repo: Path, say: Callable[[str], None] = print) -> dict[str, str]:
    """Tag every run of the store `tracking_uri` that has no fingerprint with its commit's (see the
    module docstring); {commit: fingerprint} of the commits measured. Runs already tagged are left."""
    from ..tracking.store import mlflow_client

    client = mlflow_client(tracking_uri)
    todo = trained_runs_without_fingerprint(client)
    today = code_fingerprint() if todo else ""
    done = {}
    for commit, runs in sorted(todo.items(), key=lambda item: -len(item[1])):
        done[commit] = fingerprint_of_commit(commit, repo)
        for run_id in runs:
            client.set_tag(run_id, keys.FINGERPRINT, done[commit])
        same = " (today's code)" if done[commit] == today else ""
        say(f"{commit[:7]}: {done[commit]}{same}, {len(runs)} run(s)")
    return done
