"""Write the README's tables that a command prints from the committed store, as that command prints them.

    python tools/readme_tables.py            # rewrite them in README.md (a minute or two: every report)
    python tools/readme_tables.py --check    # say which differ, change nothing (exit 1 if any)

The README quotes `hmer report` in three kinds of places, and tests/test_committed_results.py holds
each to the store: each finished study's table, the fenced block after "`hmer report --study S`
prints it:" (or "them:"), from its header line to its last variant row of the paired differences
(and, where the prose reads it, the validation table); the frontier's points and where the budgets
sit, the fenced block after "`hmer report --frontier` prints it:"; and the claims tables of `hmer
report --claims`, the first markdown table whose header begins `| claim |` on ExpRate, the second
within two errors. When a study is published or rescored, this writes them again instead of by hand,
and the frontier's figure (docs/frontier_cpu.png) as that report draws it.
The prose around them, which reads their numbers, is still written by a person.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = "sqlite:///mlruns/mlflow.db"  # relative: the commands run in the checkout

# Each study the README prints, with its variants as the report names them; the studies whose
# validation table the README prints too.
STUDY_VARIANTS = {
    "ablate_direction-cpu": ("l2r (baseline)", "r2l", "bi"),
    "ablate_decoder-cpu": ("rnn (baseline)", "transformer", "convs2s"),
    "ablate_coverage-cpu": ("none (baseline)", "self", "cross", "fusion"),
    "ablate_posenc-cpu": ("sin2d (baseline)", "learned", "cape", "none"),
}
WITH_VALIDATION = {"ablate_posenc-cpu"}
FRONTIER_COMMAND = "hmer report --frontier"  # its default study, frontier-cpu
FRONTIER_FIGURE = ROOT / "docs" / "frontier_cpu.png"  # the README shows the figure that report draws
CLAIM_METRICS = ("exprate", "le2")  # the README's claims tables, in order


def study_block(printed: str, variants: tuple[str, ...], with_validation: bool) -> str:
    """The lines of `hmer report --study`'s output that the README prints: from the table's header
    to the last variant row of the paired differences (or to the end of the validation table)."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("variant "))
    pattern = re.compile("^(" + "|".join(map(re.escape, variants)) + ") ")
    rows = [i for i, line in enumerate(lines) if pattern.match(line)]
    if len(rows) < 2 * len(variants):
        raise ValueError(f"the report prints {len(rows)} rows of {variants}, not a table and its differences")
    end = rows[2 * len(variants) - 1]
    if with_validation:
        end = next(i for i, line in enumerate(lines) if line.startswith("Validation beside")) + 2
        while end + 1 < len(lines) and lines[end + 1].strip():
            end += 1
    return "\n".join(lines[start:end + 1])


def frontier_block(printed: str) -> str:
    """The lines of `hmer report --frontier`'s output that the README prints: from the count of finished
    points to the last row of where the budgets sit (not the files it wrote)."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if "planned points finished" in line)
    end = max(i for i, line in enumerate(lines) if line.startswith("|"))
    return "\n".join(lines[start:end + 1])


def replace_fenced(text: str, command: str, block: str) -> str:
    """`text` with the fenced block after "`COMMAND` prints it:" (or "them:") set to `block`."""
    found = re.search("`" + re.escape(command) + r"` prints (them|it):\n\n```\n", text)
    if found is None:
        raise ValueError(f"README.md: no fenced block after \"`{command}` prints it:\"")
    end = text.index("```", found.end())
    return text[:found.end()] + block + "\n" + text[end:]


def replace_markdown_table(text: str, index: int, table: str) -> str:
    """`text` with its `index`-th (0-based) markdown table whose header begins `| claim |` set to `table`."""
    starts = [m.start() for m in re.finditer(r"^\| claim \|", text, flags=re.M)]
    if len(starts) <= index:
        raise ValueError(f"README.md: {len(starts)} claims table(s), not {index + 1}")
    start = starts[index]
    lines = text[start:].split("\n")
    n = next(i for i, line in enumerate(lines) if not line.startswith("|"))
    return text[:start] + table + "\n" + "\n".join(lines[n:])


def hmer(*args: str, out: Path) -> str:
    """What `hmer ARGS --tracking-uri STORE --out OUT` prints, run as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "hmer.cli", *args, "--tracking-uri", STORE, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"hmer {' '.join(args)} failed: {last}")
    return done.stdout


def claims_markdown(metric: str) -> str:
    """The claims table on `metric` as `hmer report --claims --out` writes it into claims.md."""
    with tempfile.TemporaryDirectory() as tmp:
        hmer("report", "--claims", "--metric", metric, out=Path(tmp))
        lines = (Path(tmp) / "claims.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| claim |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def study_report(study: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return hmer("report", "--study", study, out=Path(tmp))


def written(text: str, figure: Path | None = None) -> str:
    """The README's text with every table above as the store prints it now; with `figure`, the
    frontier's figure that the same report drew is copied there."""
    for study, variants in STUDY_VARIANTS.items():
        block = study_block(study_report(study), variants, study in WITH_VALIDATION)
        text = replace_fenced(text, f"hmer report --study {study}", block)
    with tempfile.TemporaryDirectory() as tmp:
        text = replace_fenced(text, FRONTIER_COMMAND, frontier_block(hmer("report", "--frontier", out=Path(tmp))))
        if figure is not None:
            shutil.copyfile(Path(tmp) / "plots" / "frontier.png", figure)
    for index, metric in enumerate(CLAIM_METRICS):
        text = replace_markdown_table(text, index, claims_markdown(metric))
    return text


def write_unless_changed(path: Path, before: str, after: str) -> bool:
    """Write `after` over `path` whole, unless the file no longer holds `before`: the reports take
    minutes, and an edit made meanwhile would be written over with the text read before it."""
    from hmer.atomic import write_text_atomically

    if path.read_text() != before:
        return False
    write_text_atomically(path, after)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="say which tables differ; change nothing")
    args = p.parse_args()
    readme = ROOT / "README.md"
    before = readme.read_text()
    after = written(before, figure=None if args.check else FRONTIER_FIGURE)
    old_lines = set(before.splitlines())
    changed = [line for line in after.splitlines() if line not in old_lines]
    if args.check:
        print("\n".join(changed) if changed else "README.md prints every table as the store does")
        return 1 if changed else 0
    if after != before and not write_unless_changed(readme, before, after):
        print("README.md: changed while the reports ran; nothing written, run again", file=sys.stderr)
        return 1
    print(f"README.md: {len(changed)} line(s) written anew")
    return 0


if __name__ == "__main__":
    sys.exit(main())
