"""How much a fresh clone grows between two commits, and what grew it.

    python benchmarks/clone_growth.py a06d1bc            # against HEAD: about a minute a clone
    python benchmarks/clone_growth.py a06d1bc main --top 15

A fresh clone receives one pack, with git's delta compression across every version of a file, so
the size of that pack (`git count-objects -vH`, `size-pack`) is what a new user downloads and
keeps. The loose objects of the working repository overstate it: each commit of a changed binary
(a store's SQLite database, a checkpoint) is a whole compressed copy there, and a delta in a pack.

Each commit is fetched alone (its history with it) into a new bare repository, as `git clone
--no-local` would, and measured; then the objects the later commit adds are listed by path with
their size on disk in its pack, summed per top-level folder, and the largest named.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def fresh_clone(commit: str, into: Path) -> float:
    """Fetch `commit` and its history into a new bare repository; returns its pack's MiB."""
    subprocess.run(["git", "init", "-q", "--bare", str(into)], check=True)
    git("fetch", "-q", "--no-tags", f"file://{ROOT}", commit, cwd=into)
    counts = dict(line.split(": ", 1) for line in git("count-objects", "-v", cwd=into).splitlines())
    return (int(counts["size-pack"]) + int(counts["size"])) / 1024  # KiB -> MiB


def added_on_disk(base: str, head: str, repo: Path) -> list[tuple[int, str]]:
    """(bytes in the pack, path) of every object `head` has that `base` has not."""
    listed = git("rev-list", "--objects", f"{base}..{head}", cwd=repo).splitlines()
    paths = {}
    for line in listed:
        oid, _, path = line.partition(" ")
        paths[oid] = path
    sizes = subprocess.run(["git", "cat-file", "--batch-check=%(objectname) %(objectsize:disk)"], cwd=repo,
                           input="\n".join(paths) + "\n", check=True, capture_output=True, text=True).stdout
    return [(int(size), paths[oid]) for oid, size in (line.split() for line in sizes.splitlines())]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the earlier commit (a name git resolves)")
    p.add_argument("head", nargs="?", default="HEAD", help="the later commit (default HEAD)")
    p.add_argument("--top", type=int, default=10, help="how many of the largest added paths to name")
    args = p.parse_args()
    try:
        base, head = (git("rev-parse", "--verify", f"{name}^{{commit}}").strip() for name in (args.base, args.head))
    except subprocess.CalledProcessError as e:
        print(f"clone_growth: not a commit of {ROOT}: {e.stderr.strip()}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="clone-growth-") as tmp:
        sizes = {}
        for name, commit in (("base", base), ("head", head)):
            began = time.perf_counter()
            sizes[name] = fresh_clone(commit, Path(tmp) / name)
            print(f"{name} {commit[:7]}: a fresh clone's pack is {sizes[name]:.2f} MiB "
                  f"(fetched in {time.perf_counter() - began:.0f} s)")
        n = git("rev-list", "--count", f"{base}..{head}").strip()
        print(f"growth over {n} commits: {sizes['head'] - sizes['base']:+.2f} MiB")
        added = added_on_disk(base, head, Path(tmp) / "head")
    folders: collections.Counter = collections.Counter()
    for size, path in added:
        folders[path.split("/", 1)[0] if path else "(commits and trees)"] += size
    print("\nadded objects' size in the head clone's pack, by top-level folder (MiB):")
    for folder, size in folders.most_common():
        print(f"  {size / 2**20:8.2f}  {folder}")
    print(f"\nthe {args.top} largest added objects (MiB, a changed file counts once a version):")
    for size, path in sorted(added, reverse=True)[:args.top]:
        print(f"  {size / 2**20:8.2f}  {path or '(commit or tree)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
