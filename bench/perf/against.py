"""One bench script run on this tree and on another commit's, back to back on one lake, with the ratios.

    GEM_HOME=lakehouse-small python -m bench.perf.against --commit <commit> -- \\
        bench/perf/export.py --preset small --model-version V --out {out}

Checks `--commit` out into a git worktree beside the system's temp folder (reused if there), then runs
the script once per tree, in `--order` (default: the other commit first), each as
`python <args>` (a script or `-m <module>` first) with the tree as working directory and first on
PYTHONPATH, so that the tree's own packages are imported (and the subprocesses they launch, which inherit
the environment, import them too) while the pinned environment is this one. `{out}` in the arguments
becomes a per-tree JSON file; the script must write its results there. Prints every
numeric result of both runs side by side with the speed-up: old / new for keys ending in `seconds`
or `_s`, new / old for rates (keys ending in `per_second`), and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO


def worktree(commit: str) -> Path:
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"gem-bench-{sha[:12]}"
    if not (path / ".git").exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, check=True)
    return path


def run(tree: Path, script_and_args: list[str], out: Path) -> dict[str, Any]:
    out.unlink(missing_ok=True)
    args = [a.replace("{out}", str(out)) for a in script_and_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, *args], cwd=tree, env=env, check=True)
    if not out.is_file():
        raise FileNotFoundError(f"{args[0]} wrote no results to {out}; pass --out {{out}} (or its equivalent)")
    return json.loads(out.read_text())


def numbers(results: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON object, keyed by their dotted path."""
    if isinstance(results, dict):
        return {k: v for key, value in results.items() for k, v in numbers(value, f"{prefix}{key}.").items()}
    if isinstance(results, int | float) and not isinstance(results, bool):
        return {prefix.rstrip("."): float(results)}
    return {}


def speedup(key: str, old: float, new: float) -> float | None:
    if key.endswith(("seconds", "_s")) and new > 0:
        return old / new
    if key.endswith("per_second") and old > 0:
        return new / old
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", required=True, help="the commit to compare against (the 'old' side)")
    parser.add_argument("--order", choices=("old-first", "new-first"), default="old-first")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- then the bench script and its arguments")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("give the bench script and its arguments after --")
    trees = {"old": worktree(args.commit), "new": REPO}
    order = ["old", "new"] if args.order == "old-first" else ["new", "old"]
    with tempfile.TemporaryDirectory() as tmp:
        results = {side: run(trees[side], script, Path(tmp) / f"{side}.json") for side in order}
    old, new = numbers(results["old"]), numbers(results["new"])
    print(f"\n{' '.join(script)}\nold: {args.commit} ({trees['old']}), new: this tree\n")
    print("| result | old | new | speed-up |\n|---|---|---|---|")
    for key in sorted(old.keys() & new.keys()):
        ratio = speedup(key, old[key], new[key])
        print(f"| {key} | {old[key]:,.3g} | {new[key]:,.3g} | {'' if ratio is None else f'{ratio:.2f}x'} |")
    print(json.dumps({"commit": args.commit, "script": script, "old": results["old"], "new": results["new"]}))


if __name__ == "__main__":
    main()
