"""Holdout NE against training compute for GEM, DLRM and DCN-V2 at several sizes: the scaling study.

`gem-mlp`, GEM's ladder with MLP interaction layers in place of Wukong's, is Wukong's ablation at every size.

    GEM_HOME=lakehouse-small python -m bench.research.scaling --preset small --seeds 0,1 \
        --out docs/scaling.json --plot docs/scaling.png
    GEM_HOME=lakehouse-small python -m bench.research.scaling --preset small --seeds 0,1 --rungs xs,s,m
    GEM_HOME=lakehouse-small python -m bench.research.scaling --preset small --seeds 0,1 --rungs l \\
        --window-days 1,2,4,0 \
        --out docs/scaling_data_l.json --plot docs/scaling_data_l.png

Each architecture climbs a ladder of sizes (`LADDERS`: overrides that widen its dense arches together;
the sparse tables and the data stay the same). Each (architecture, size, seed) is trained for one epoch
(`EPOCHS`: every example seen once, as in the Wukong and Kunlun scaling studies) by the real training
job on one pinned Delta version, through `bench/research/model_quality.py`'s `train`, so a run already trained
is read back, not retrained. Training compute C = dense FLOPs of one training step per example
(forward + backward; `bench/perf/train_throughput.py`'s count, embedding lookups excluded) x examples
seen. Per architecture and task, least squares over every run fits log NE = log a - alpha log C; alpha
is the power-law exponent (steeper = larger) and its 95% interval uses Student's t on the fit's
standard error. The plot shows NE against C on log-log axes with each fit. `--rungs` fits a part of
the ladder (the second command: below its largest rung) from the same runs; with one size it trains
and lists the runs without a fit. `--window-days` is the data axis (the third command): each size is
also trained on only the last N days before the holdout (`train.window_days`; 0: every day), so that
the examples, and with them the compute, grow at a fixed size; every (size, window) run of an
architecture is a point of its fit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch
from deltalake import DeltaTable

from bench.common import dense_flops_per_example, train
from gem_model.config import TASKS, GemConfig
from gem_model.data.loader import ds_filter, open_delta
from gem_model.paths import GemPaths

EPOCHS = 1
# Each rung widens the dense arches together; the middle GEM rung and DLRM's/DCN-V2's second are the defaults.
LADDERS: dict[str, dict[str, dict[str, Any]]] = {
    "gem": {
        "xs": {
            "shared_dims": [64, 32],
            "wukong": {"n_fm": 4, "n_lc": 4, "rank": 4, "mlp_dims": [64]},
            "sequence": {"dim": 16},
        },
        "s": {},
        "m": {
            "shared_dims": [256, 128],
            "wukong": {"n_fm": 16, "n_lc": 16, "rank": 16, "mlp_dims": [256]},
            "sequence": {"dim": 48},
        },
        "l": {
            "shared_dims": [512, 256],
            "wukong": {"n_fm": 32, "n_lc": 32, "rank": 16, "mlp_dims": [512]},
            "sequence": {"dim": 64},
        },
    },
    "dlrm": {
        "xs": {"shared_dims": [64, 32]},
        "s": {},
        "m": {"shared_dims": [512, 256]},
        "l": {"shared_dims": [1024, 1024, 512]},
    },
    "dcnv2": {
        "xs": {"shared_dims": [64, 32], "dcn_layers": 2, "dcn_rank": 8},
        "s": {},
        "m": {"shared_dims": [512, 256], "dcn_layers": 4, "dcn_rank": 32},
        "l": {"shared_dims": [1024, 1024, 512], "dcn_layers": 6, "dcn_rank": 64},
    },
}
# Wukong's ablation at every size: GEM's ladder with MLP interaction layers of the same shapes (`use_wukong=false`;
# Wukong's `rank` does not apply). A rung's own `architecture` names the model it builds.
LADDERS["gem-mlp"] = {
    rung: {
        **model,
        "architecture": "gem",
        "use_wukong": False,
        "wukong": {k: v for k, v in model.get("wukong", {}).items() if k != "rank"},
    }
    for rung, model in LADDERS["gem"].items()
}
RUNGS = tuple(LADDERS["gem"])  # every ladder has the same sizes
# Student's t 97.5% quantiles by degrees of freedom (beyond the table, the normal's 1.96 is close enough).
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    18: 2.101,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def training_rows(table: Path, version: int, cfg: GemConfig) -> int:
    """Impressions of `cfg`'s training days (its window before the holdout) in `version` of gold.user_timelines."""
    days = open_delta(table, version).to_table(
        columns=["impression_count"], filter=ds_filter(cfg.train_start, cfg.world.holdout_start)
    )
    return int(pc.sum(days.column("impression_count")).as_py() or 0)


def rung_config(base: GemConfig, architecture: str, rung: str, seed: int, window_days: int = 0) -> GemConfig:
    overrides = {
        "model": {"architecture": architecture, **LADDERS[architecture][rung]},
        "train": {"epochs": EPOCHS, "seed": seed, "window_days": window_days},
    }
    return GemConfig.from_dict(overrides, base=base)


def t975(df: int) -> float:
    """Student's t 97.5% quantile, rounded up to the table's nearest smaller df (a wider interval)."""
    if df < 1:
        return math.inf
    return 1.96 if df > 30 else _T975[max(d for d in _T975 if d <= df)]


def power_law(compute: list[float], ne: list[float]) -> dict[str, float]:
    """Least squares log NE = log a - alpha log C: alpha, its standard error and 95% interval, and a."""
    x, y = np.log(np.asarray(compute)), np.log(np.asarray(ne))
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    df = len(x) - 2
    se = (
        math.sqrt(float(residual @ residual) / df * float(np.linalg.inv(design.T @ design)[1, 1]))
        if df > 0
        else math.inf
    )
    alpha = -float(coef[1])
    half = t975(df) * se
    return {
        "alpha": alpha,
        "alpha_se": se,
        "alpha_low": alpha - half,
        "alpha_high": alpha + half,
        "log_a": float(coef[0]),
        "points": len(x),
    }


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, len(TASKS), figsize=(11, 4.2))
    for ax, task in zip(axes, TASKS):
        for arch, runs in results["runs"].items():
            c = [r["compute"] for r in runs]
            ne = [r["metrics"][f"{task}/ne"] for r in runs]
            line = ax.loglog(c, ne, "o", label=arch, alpha=0.8)[0]
            if arch not in results["fits"]:
                continue
            fit = results["fits"][arch][task]
            grid = np.geomspace(min(c), max(c), 20)
            ax.loglog(
                grid,
                np.exp(fit["log_a"]) * grid ** -fit["alpha"],
                "-",
                color=line.get_color(),
                label=f"{arch} fit: alpha {fit['alpha']:.4f} ± {fit['alpha_high'] - fit['alpha']:.4f}",
            )
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(matplotlib.ticker.FormatStrFormatter("%.3f"))  # NE spans a few percent: plain decimals
        # Compute spans one to three decades: "2e+12" labels stay apart where "2 x 10^12" ones overlap.
        ax.xaxis.set_major_formatter(matplotlib.ticker.LogFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False))
        ax.tick_params(axis="x", which="both", labelsize=8)
        ax.set_xlabel("training compute: dense FLOPs per example × examples")
        ax.set_ylabel(f"holdout NE ({task})")
        sizes = sorted({r["rung"] for runs in results["runs"].values() for r in runs if "rung" in r})
        ax.set_title(f"{task}, {results['preset']}, {EPOCHS} epoch" + (f", size {sizes[0]}" if len(sizes) == 1 else ""))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--config", help="JSON file of overrides applied to every run")
    parser.add_argument("--architectures", default=",".join(LADDERS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument(
        "--rungs",
        default=",".join(RUNGS),
        help="the sizes to train and fit, e.g. xs,s,m to fit the ladder below its largest rung",
    )
    parser.add_argument(
        "--window-days",
        default="0",
        help="train.window_days values, each trained at every size: the data axis (0: every day)",
    )
    parser.add_argument("--out", type=Path, help="write the runs and fits as JSON here")
    parser.add_argument("--plot", type=Path, help="write the log-log plot (PNG) here")
    args = parser.parse_args(argv)
    rungs = args.rungs.split(",")
    if unknown := set(rungs) - set(RUNGS):
        parser.error(f"--rungs: unknown sizes {sorted(unknown)}; choose from {','.join(RUNGS)}")
    base = GemConfig.load(args.preset, args.config)
    paths = GemPaths.from_env()
    examples = paths.table("gold.user_timelines")  # what the teacher trains on
    if not (examples / "_delta_log").is_dir():
        raise SystemExit(
            f"no {examples}: build the features first (python -m jobs.build_features --preset "
            f"{args.preset}, or bench/research/model_quality.py, which builds them)"
        )
    data_version = DeltaTable(str(examples)).version()
    torch.set_num_threads(os.cpu_count() or 1)
    windows = [int(w) for w in args.window_days.split(",")]
    seen = {
        w: training_rows(examples, data_version, GemConfig.from_dict({"train": {"window_days": w}}, base=base)) * EPOCHS
        for w in windows
    }
    results: dict[str, Any] = {"preset": base.preset, "epochs": EPOCHS, "runs": {}, "fits": {}}
    print("| model | size | days | seed | dense MFLOP / example | examples | compute (FLOP) | ctr NE | cvr NE |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arch in args.architectures.split(","):
        runs = []
        for rung in rungs:
            flops = None
            for window in windows:
                for seed in (int(s) for s in args.seeds.split(",")):
                    cfg = rung_config(base, arch, rung, seed, window)
                    manifest = train(cfg, paths, f"scale-{cfg.preset}-{arch}-{rung}-{cfg.fingerprint}", data_version)
                    flops = flops or dense_flops_per_example(cfg, paths)
                    overall = {k: v for k, v in manifest["metrics"].items() if k.split("/")[0] in TASKS}
                    runs.append(
                        {
                            "rung": rung,
                            "window_days": window,
                            "seed": seed,
                            "flops_per_example": flops,
                            "examples": seen[window],
                            "compute": flops * seen[window],
                            "metrics": overall,
                        }
                    )
                    print(
                        f"| {arch} | {rung} | {window or 'all'} | {seed} | {flops / 1e6:.2f} | {seen[window]:,} | "
                        f"{flops * seen[window]:.3g} | {overall['ctr/ne']:.4f} | {overall['cvr/ne']:.4f} |",
                        flush=True,
                    )
        results["runs"][arch] = runs
        if len({r["compute"] for r in runs}) < 2:  # every run at one compute: no slope to fit
            continue
        results["fits"][arch] = {
            task: power_law([r["compute"] for r in runs], [r["metrics"][f"{task}/ne"] for r in runs]) for task in TASKS
        }
    if results["fits"]:
        print("\n| model | task | alpha (NE ∝ C^-alpha) | 95% interval | points |\n|---|---|---|---|---|")
    for arch, fits in results["fits"].items():
        for task, fit in fits.items():
            print(
                f"| {arch} | {task} | {fit['alpha']:.5f} | [{fit['alpha_low']:.5f}, {fit['alpha_high']:.5f}] | "
                f"{fit['points']} |"
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True))
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(results, args.plot)


if __name__ == "__main__":
    main()
