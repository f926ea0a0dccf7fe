"""GEM against its baselines and ablations on one lake: holdout AUC / NE / calibration per task.

    GEM_HOME=lakehouse-small python -m bench.research.model_quality --preset small
    GEM_HOME=lakehouse-taobao python -m bench.research.model_quality --data-source taobao --variants gem,dlrm,dcnv2
    GEM_HOME=lakehouse-frappe python -m bench.research.model_quality --config gem_model/configs/frappe.json \
        --variants gem,dlrm,dcnv2,lr --seeds 0,1,2

Builds the feature tables first when the lake has none (`jobs.build_features`), then trains each
variant with each `train.seed` with the real training job (torchrun, `train.nproc` processes) on
the same pinned Delta version and reads the holdout metrics from its manifest. Prints a markdown
table (means over the seeds, the seeds' standard deviation, the mean of each run's AUC 95%
interval, the oracle's row on the synthetic world, the positives) and writes JSON to --out.
"gap closed" is (AUC - AUC_dlrm) / (AUC_oracle - AUC_dlrm).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from bench.common import REPO, VARIANTS, train_variant
from gem_model.config import TASKS, GemConfig
from gem_model.paths import GemPaths


def mean_metrics(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the seeds' runs, and `<task>/auc_seed_sd` (their AUCs' standard deviation)."""
    mean = {k: statistics.fmean(run[k] for run in runs) for k in runs[0]}
    for task in TASKS:
        if len(runs) > 1 and f"{task}/auc" in mean:
            mean[f"{task}/auc_seed_sd"] = statistics.stdev(run[f"{task}/auc"] for run in runs)
    return mean


def row(name: str, metrics: dict[str, float]) -> list[str]:
    cells = [name]
    for task in TASKS:
        if f"{task}/auc" not in metrics:
            cells += ["–"] * 5
            continue
        m = {k.removeprefix(f"{task}/"): v for k, v in metrics.items() if k.startswith(f"{task}/")}
        sd = f"{m['auc_seed_sd']:.4f}" if "auc_seed_sd" in m else "–"
        cells += [
            f"{m['auc']:.4f} [{m['auc_ci_low']:.3f}, {m['auc_ci_high']:.3f}]",
            sd,
            f"{m['ne']:.4f}",
            f"{m['calibration']:.3f}",
            f"{m['log_loss']:.4f}",
        ]
    return cells


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--data-source")
    parser.add_argument("--config", help="JSON file of overrides applied to every variant")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--seeds",
        help="comma-separated train.seed values, each variant trained with each (default: the config's seed alone)",
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    cfg = GemConfig.load(args.preset, args.config, args.data_source)
    paths = GemPaths.from_env()
    examples = paths.table("gold.user_timelines")  # what the teacher trains on
    if not (examples / "_delta_log").is_dir():
        build = [sys.executable, "-m", "jobs.build_features", "--preset", args.preset]
        build += ["--data-source", cfg.data.source] + (["--config", args.config] if args.config else [])
        subprocess.run(build, check=True, cwd=REPO)
    data_version = DeltaTable(str(examples)).version()
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [cfg.train.seed]
    results: dict[str, Any] = {"preset": cfg.preset, "data_source": cfg.data.source, "seeds": seeds, "variants": {}}
    for name in args.variants.split(","):
        runs = {}
        for seed in seeds:
            started = time.monotonic()
            manifest = train_variant(cfg, paths, name, data_version, seed)
            runs[seed] = {
                "metrics": manifest["metrics"],
                "train_seconds": manifest["train_seconds"],
                "wall_seconds": time.monotonic() - started,
            }
        results["variants"][name] = {"metrics": mean_metrics([r["metrics"] for r in runs.values()]), "seeds": runs}
    header = ["model"] + [
        f"{t} {m}" for t in TASKS for m in ("AUC [95% CI]", "AUC seed sd", "NE", "calibration", "log loss")
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    first = next(iter(results["variants"].values()))["metrics"]
    for name, result in results["variants"].items():
        lines.append("| " + " | ".join(row(name, result["metrics"])) + " |")
    if "ctr/oracle_auc" in first:
        oracle = ["oracle (true p)"] + [
            cell
            for t in TASKS
            for cell in (f"{first[f'{t}/oracle_auc']:.4f}", "–", f"{first[f'{t}/oracle_ne']:.4f}", "–", "–")
        ]
        lines.append("| " + " | ".join(oracle) + " |")
    positives = {t: (int(first.get(f"{t}/positives", 0)), int(first.get(f"{t}/rows", 0))) for t in TASKS}
    lines.append("")
    lines.append("holdout: " + ", ".join(f"{t} {p:,} positives of {n:,} rows" for t, (p, n) in positives.items()))
    if "dlrm" in results["variants"] and "ctr/oracle_auc" in first:
        for task in TASKS:
            dlrm = results["variants"]["dlrm"]["metrics"][f"{task}/auc"]
            gap = first[f"{task}/oracle_auc"] - dlrm
            closed = {n: (r["metrics"][f"{task}/auc"] - dlrm) / gap for n, r in results["variants"].items()}
            results[f"{task}_gap_closed"] = closed
            lines.append(
                f"{task} gap to the oracle closed vs DLRM: " + ", ".join(f"{n} {v:.0%}" for n, v in closed.items())
            )
    table = "\n".join(lines)
    print(table)
    results["table"] = table
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
