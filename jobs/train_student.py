"""Train the per-surface student models of one teacher version; one process, CPU.

    python -m jobs.train_student --model-version gem-tiny-<fingerprint>-d<N>
    python -m jobs.train_student --model-version V --config CONFIG.json --out $GEM_HOME/students/S

Reads `gold.training_examples` of the days after the teacher's training window with that
version's `gold.teacher_logits`, `gold.user_embeddings` and `gold.ad_embeddings` (materialise
`export_job` for those days first), fits the Student Adapter on the freshest training day(s),
trains every `student.variants` student per surface and evaluates them on the last
`student.eval_days` day(s) (`gem_model.distill`). Writes `<out>` (default
`$GEM_HOME/students/<student_version>`, named by the teacher version, the student config and
the calendar) atomically: a re-run replaces it. `--config` is a GemConfig JSON (the Dagster
asset passes the resolved one); without it GEM_PRESET / GEM_CONFIG apply. When launched by
Dagster Pipes, the log lines go to the Dagster run; the asset then commits gold.student_metrics.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, open_dagster_pipes
from deltalake import DeltaTable

from gem_model.config import GemConfig
from gem_model.distill.artefact import student_version, write_student
from gem_model.distill.data import StudentCalendar, load_student_data
from gem_model.distill.variants import train_students
from gem_model.paths import GemPaths
from gem_model.train.manifest import read_manifest
from gem_model.train.trainer import finite

INPUT_TABLES = ("gold.training_examples", "gold.teacher_logits", "gold.user_embeddings", "gold.ad_embeddings")


def train(paths: GemPaths, cfg: GemConfig, model_version: str, out: Path | None = None,
          log: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    """Train and write one student version; returns its directory and manifest."""
    started = time.monotonic()
    teacher = read_manifest(paths.model_dir(model_version))
    calendar = StudentCalendar.from_config(cfg)
    out = out or paths.student_dir(student_version(cfg, model_version))
    inputs = {name: DeltaTable(str(paths.table(name))).version() for name in INPUT_TABLES
              if (paths.table(name) / "_delta_log").is_dir()}
    data = load_student_data(paths, cfg, teacher, calendar)
    log(f"{len(data):,} impressions on {calendar.to_dict()} with teacher {model_version}; "
        f"missing embeddings {data.missing_embeddings}")
    repr_dim = int(teacher["config"]["model"]["repr_dim"])
    run = train_students(data, calendar, cfg, repr_dim)
    lag = timedelta(days=cfg.student.embedding_lag_days)
    manifest = {
        "student_version": out.name,
        "created_at": datetime.now(UTC).isoformat(),
        "teacher": {"model_version": model_version, "repr_dim": repr_dim,
                    "train_days": teacher["training_data"]["train_days"]},
        "calendar": {**calendar.to_dict(),
                     "embedding_days": {d.isoformat(): (d - lag).isoformat() for d in calendar.days}},
        "inputs": {"delta_versions": inputs, "missing_embeddings": data.missing_embeddings},
        "config": cfg.to_dict(),
        "rows": run.rows,
        "adapter_fit": run.adapter_fit,
        "fits": {s: {v: dataclasses.asdict(fit) for v, fit in fits.items()} for s, fits in run.fits.items()},
        "metrics": finite(run.metrics),
        "gains": run.gains,
        "inference_ms_per_1000": run.inference_ms_per_1000,
        "torch_threads": torch.get_num_threads(),
        "train_seconds": time.monotonic() - started,
    }
    write_student(run, out, manifest)
    overall = run.gains["all"]["ctr"]
    log(f"wrote {out}: ctr NE labels {run.metrics.get('labels/ctr/ne', float('nan')):.4f}, "
        f"KD gain {overall['kd_ne_gain']:+.4f}, adapter gain {overall['adapter_ne_gain']:+.4f}")
    return out, manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-version", required=True, help="the teacher version ($GEM_HOME/models/<version>)")
    parser.add_argument("--config", type=Path, help="GemConfig JSON; default: GEM_PRESET / GEM_CONFIG")
    parser.add_argument("--out", type=Path, help="output directory; default $GEM_HOME/students/<student_version>")
    args = parser.parse_args(argv)
    cfg = GemConfig.from_dict(json.loads(args.config.read_text())) if args.config else GemConfig.from_env()
    # The students' ops are far too small for intra-op threads, which only contend: on a loaded
    # 2-core machine two threads made a training step ~50x slower than one (~300 ms against ~4 ms).
    torch.set_num_threads(1)
    pipes_cm = open_dagster_pipes() if DAGSTER_PIPES_CONTEXT_ENV_VAR in os.environ else nullcontext(None)
    with pipes_cm as pipes:
        def log(message: str) -> None:
            print(message, flush=True)
            if pipes is not None:
                pipes.log.info(message)

        train(GemPaths.from_env(), cfg, args.model_version, args.out, log)


if __name__ == "__main__":
    main()
