"""Every command the README shows works as shown on a fresh clone (issue 49): the quick, read-only
ones run here against a copy of the committed store, which they must leave byte for byte as it was;
the others (they install, train for hours, need a run id, a GPU or a server) are each marked with
the prior step they need, and their arguments are still parsed by the command's own parser, so that
a renamed option or a removed command fails here instead of on a reader's machine.

A command is a line of a ```bash block (continued lines joined, comments dropped, `&&` splitting it),
or an inline code span that starts like one (`hmer ...`, `python studies/...`). A command the README
gains that this file neither runs nor marks fails `test_every_readme_command_is_run_or_marked`."""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MLRUNS = REPO / "mlruns"

# Commands run here, in a copy of the committed store, read-only (in-process through `hmer.cli.main`).
RUN = (
    r"hmer models",
    r"hmer report --list",
    r"hmer report --study ablate_\w+-cpu(-\w+)?( --metric le2)?",
    r"hmer report --claims( --metric (le2|lgeval_exprate))?",
    r"hmer report --experiment [\w-]+",
    r"hmer report --frontier",
    r"hmer config [a-z][\w-]*( .*)?",
)

# Commands that need a prior step, with it. Their arguments are parsed all the same.
NEEDS = (
    (r"pip install .*", "an install into a fresh environment (CI's .ci/run does it)"),
    (r"python -m pytest.*", "the tests themselves"),
    (r"python studies/ablate_direction\.py", "the main job: tests/test_committed_results.py runs it on a clone"),
    (r"python studies/\w+\.py.*", "hours of training (the studies' tests run each study at a smoke budget)"),
    (r"hmer study .*", "hours of training, as a script of studies/ (tests/test_studies.py runs a study by name)"),
    (r"hmer train .*", "training (tests/test_training.py trains tiny models through the same command)"),
    (r"torchrun .*", "several GPUs"),
    (r"hmer (evaluate|predict|analyze) .*(<run-id>|RUN).*", "a run id of a trained model"),
    (r"hmer report --runs .*", "run ids of trained models"),
    (r"hmer import .*", "a BTTR or CoMER checkpoint of your own (tests/test_reference_import.py imports the peers')"),
    (r"hmer data (check|render).*", "the CROHME data (Getting CROHME); tests/test_data_commands.py runs both"),
    (r"hmer runs (export|import|workspace|publish|rename|supersede)( .*)?", "a store of your own runs to move"),
    (r"hmer runs show .*(<run-id>|RUN|[0-9a-f]{8,}).*",
     "a run id (tests/test_committed_store_schema.py shows committed runs)"),
    (r"hmer runs rescore( .*)?", "a store to write into: it logs metrics into the committed runs "
                                 "(tests/test_runs_rescore.py rescores a store of its own)"),
    (r"mlflow ui .*", "a server until Ctrl-C (tests/test_ui.py opens it in a browser)"),
    (r"optuna-dashboard .*", "a server until Ctrl-C (tests/test_ui.py opens it in a browser)"),
    (r"hmer ui.*", "servers until Ctrl-C (tests/test_ui.py follows the links it prints)"),
    (r"hmer notebooks.*", "minutes of notebook execution (tests/test_notebooks.py runs them on a smoke store)"),
    (r"hmer bench .*", "a benchmark run (minutes; docs/benchmarks.md)"),
    (r"hmer config [A-Z].*", "a preset or a study named in its place"),
    (r"hmer report --study ablate_\w+-smoke", "a smoke study run first (`--budget smoke`, into scratch/)"),
    (r"git clone .*", "the network"),
)

_INLINE_STARTS = ("hmer ", "python studies/", "python -m pytest", "pip install ")
_PLACEHOLDER = "0" * 32  # what a <run-id> stands for when only the arguments are parsed


def readme_commands(text: str) -> list[str]:
    """The commands of the README, in order, each once."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    for span in re.findall(r"`([^`\n]+)`", text):
        for part in span.split("&&"):
            part = re.sub(r"^(\w+=\S+\s+)+", "", part.strip())  # an environment before the command
            # `hmer train` alone names a command in prose; with arguments it is one to type
            if part.startswith(_INLINE_STARTS) and len(part.split()) >= 3:
                commands.append(part)
    return list(dict.fromkeys(" ".join(c.split()) for c in commands))


def _how(command: str) -> tuple[str, str]:
    if any(re.fullmatch(pattern, command) for pattern in RUN):
        return "run", ""
    for pattern, reason in NEEDS:
        if re.fullmatch(pattern, command):
            return "needs", reason
    return "unknown", ""


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_every_readme_command_is_run_or_marked():
    unknown = [c for c in COMMANDS if _how(c)[0] == "unknown"]
    assert not unknown, ("the README shows commands this test neither runs nor marks with the step they need "
                         f"(tests/test_readme_commands.py RUN or NEEDS): {unknown}")
    assert any(_how(c)[0] == "run" for c in COMMANDS)


def _parse(command: str) -> None:
    """Parse the command's arguments with its own parser (an argparse error exits with status 2)."""
    # <run-id> and RUN stand for a run id; `bttr|comer` offers a choice: take the first
    words = [_PLACEHOLDER if re.fullmatch(r"<[\w-]+>|[A-Z][A-Z_]+", w) else w.split("|")[0]
             for w in shlex.split(command)]
    if words[0] == "hmer" or words[:3] == ["torchrun", "--nproc_per_node", "4"]:
        from hmer.cli import build_parser

        args = words[words.index("hmer.cli") + 1:] if "hmer.cli" in words else words[1:]
        parsed = build_parser().parse_args(args)
        if args[0] == "study" and parsed.name != _PLACEHOLDER:  # a study named: its own options too
            from hmer.cli.study import build_parser as study_parser
            from hmer.studies.spec import STUDIES

            study_parser(STUDIES.get(parsed.name), None).parse_args(parsed.options)
    elif words[0] == "python" and words[1].startswith("studies/"):
        from hmer.cli.study import build_parser as study_parser
        from hmer.studies.spec import STUDIES

        study_parser(STUDIES.get(Path(words[1]).stem), None).parse_args(words[2:])


@pytest.mark.parametrize("command", [c for c in COMMANDS if _how(c)[0] == "needs"])
def test_a_command_that_needs_a_prior_step_parses(command):
    try:
        _parse(command)
    except SystemExit as exc:  # argparse's way to refuse
        pytest.fail(f"the README's `{command}` is refused by its parser (exit {exc.code}); {_how(command)[1]}")


def _digest(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in ("mlflow.db", "optuna.db")}


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if not (MLRUNS / "mlflow.db").exists():
        pytest.skip("no committed store in mlruns/ (a checkout without results)")
    root = tmp_path_factory.mktemp("readme-clone")
    shutil.copytree(MLRUNS, root / "mlruns", ignore=shutil.ignore_patterns("checkpoints", "*.lock"))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in COMMANDS if _how(c)[0] == "run"])
def test_a_quick_command_runs_on_a_clone_and_leaves_the_store_as_it_was(command, clone, monkeypatch, tmp_path):
    from hmer.cli import main

    monkeypatch.chdir(clone)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("HMER_MLRUNS", raising=False)
    before = _digest(clone / "mlruns")
    words = shlex.split(command)[1:]
    if words[0] == "report" and "--list" not in words:
        words += ["--out", str(tmp_path / "report")]  # where a reader would write theirs: not the store
    assert main(words) == 0, f"the README's `{command}` failed on a clone"
    assert _digest(clone / "mlruns") == before, f"the README's `{command}` modified the committed store"
