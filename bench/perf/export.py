"""Export speed on one lake: scoring rows/s (torchrun ranks, one process) and the export's wall time.

    GEM_HOME=lakehouse-small python -m bench.perf.export --preset small --ds 2026-11-08

The model is `--model-version` (default: the `gem` variant bench/research/model_quality.py trained on this
lake). In the same run it measures, on the day's inputs:
- `jobs.score` as one process (torch's default threads) and under torchrun with `--nproc`
  ranks of one thread each, end to end (start-up, model load, all three tables);
- the whole `export_job` of the day through Dagster (user input, scoring, commits, both indexes,
  candidates), with each step's time; the scoring figures are printed before it starts, and a failed job (e.g.
  a blocking index check) exits non-zero after its steps' times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from bench.common import REPO, variant_version
from dagster_project.resources.launchers import LocalTorchrunLauncher
from gem_model.paths import GemPaths


def scoring_run(version: str, ds: date, users: Path, out: Path, nproc: int) -> dict[str, float]:
    shutil.rmtree(out, ignore_errors=True)
    args = ["--model-version", version, "--ds", ds.isoformat(), "--users", str(users), "--out", str(out)]
    launcher = LocalTorchrunLauncher()
    command = launcher.command("jobs.score", args, nproc) if nproc > 1 else [sys.executable, "-m", "jobs.score", *args]
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, env=launcher.environment(nproc), stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    rows = sum(json.loads((out / "_SUCCESS.json").read_text())["rows"].values())
    return {"seconds": seconds, "rows": rows, "rows_per_second": rows / seconds}


def export_job(lake, version: str, ds: date) -> dict[str, float]:
    from dagster_project.definitions import build_definitions
    from dagster_project.defs.partitions import MODEL_VERSIONS, model_day_key
    from dagster_project.demo import instance_for

    instance = instance_for(lake)
    if not instance.has_dynamic_partition(MODEL_VERSIONS.name, version):
        instance.add_dynamic_partitions(MODEL_VERSIONS.name, [version])
    started = time.perf_counter()
    result = (
        build_definitions(lake=lake)
        .resolve_job_def("export_job")
        .execute_in_process(instance=instance, partition_key=model_day_key(version, ds), raise_on_error=False)
    )
    total = time.perf_counter() - started
    stats = instance.get_run_step_stats(result.run_id)
    failed = [s.step_key for s in stats if s.status is not None and s.status.value == "FAILURE"]
    steps = {f"{s.step_key}_seconds": s.end_time - s.start_time for s in stats if s.end_time}
    return {"success": result.success, "failed_steps": failed, "total_seconds": total, **steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--ds", type=date.fromisoformat, help="default: the last day of the world")
    parser.add_argument("--model-version")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from dagster_project.resources.lake import LakeResource
    from dagster_project.resources.spark import SparkResource
    from gem_lake.export_tables import write_user_input

    lake = LakeResource(home=str(GemPaths.from_env().home), preset=args.preset)
    cfg, paths = lake.config, lake.paths
    ds = args.ds or cfg.world.days[-1]
    version = args.model_version or variant_version(cfg, "gem")
    work = paths.staging / "bench" / "export"
    users = work / "users"
    write_user_input(SparkResource().session(), paths, cfg.features, ds, users, cfg.export.user_input_files)

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    results = {
        "one_process": scoring_run(version, ds, users, work / "one", 1),
        "torchrun": scoring_run(version, ds, users, work / "ranks", args.nproc),
    }
    print(f"\n{args.preset}, ds={ds}, model {version}, {machine}\n")
    print("| scoring | rows | seconds | rows/s |\n|---|---|---|---|")
    for name, label in (
        ("one_process", "jobs.score, 1 process"),
        ("torchrun", f"jobs.score, torchrun {args.nproc} ranks"),
    ):
        r = results[name]
        print(f"| {label} | {r['rows']:,} | {r['seconds']:.1f} | {r['rows_per_second']:,.0f} |", flush=True)
    results["export_job"] = export_job(lake, version, ds)
    shutil.rmtree(work)
    print("\n| export_job step | seconds |\n|---|---|")
    for step, seconds in results["export_job"].items():
        if step.endswith("_seconds"):
            print(f"| {step.removesuffix('_seconds')} | {seconds:.1f} |")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"preset": args.preset, "ds": ds.isoformat(), "model_version": version, "machine": machine, **results},
                indent=2,
            )
        )
    if not results["export_job"]["success"]:
        raise SystemExit(
            f"export_job failed at {results['export_job']['failed_steps']}: the timings above are of a failed run"
        )


if __name__ == "__main__":
    main()
