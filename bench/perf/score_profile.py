"""Where batch scoring spends its time: each phase of `jobs/score.py`'s path, timed separately.

    GEM_HOME=lakehouse-small python -m bench.perf.score_profile --model-version V --ds 2026-11-08

One process, torch's default threads, the job's `export` settings (`chunk_rows`, `bf16`), the day's
three inputs (the users' input is rebuilt here with Spark from silver.user_features and
gold.user_sequences, as the export asset writes it). Phases, summed over every chunk (the same
functions the job calls):
start-up (importing torch + torchrec in a fresh interpreter), model load (checksums + DCP),
read (Delta/Parquet row groups to Arrow), KJT construction, sparse arch (embedding lookups and
the sequence's jagged tensors), dense arch (towers, or the interaction arch and heads), output
conversion (tensors to the Arrow tables of the contract) and Parquet write. Then the top
operators of the impressions' forward by torch.profiler, and the forward's FLOPs per impression
(matmuls and attention, bench/common.py) against the fp32 and bf16 matmul peaks. Prints Markdown
and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

from bench.common import count_flops, matmul_peak
from gem_model.config import ExportConfig
from gem_model.data.loader import features_to_kjt, timelines_to_kjt
from gem_model.export.batch import scoring_inputs
from gem_model.export.checkpoint import load_model
from gem_model.export.scoring import score_embeddings, score_timelines
from gem_model.paths import GemPaths

PHASES = ("read", "kjt", "sparse", "dense", "convert", "write")


def startup_seconds() -> float:
    code = "import time; t = time.perf_counter(); import torch, torchrec; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def users_input(paths: GemPaths, loaded, ds: date, out: Path) -> Path:
    from gem_lake.export_tables import write_user_input
    from gem_lake.spark.session import build_spark_session

    spark = build_spark_session()
    write_user_input(spark, paths, loaded.config.features, ds, out, ExportConfig().user_input_files)
    spark.stop()
    return out


@torch.inference_mode()
def profile_input(loaded, name: str, source, ds: date, chunk_rows: int, out: Path) -> tuple[dict[str, float], int]:
    """Seconds per phase and rows for one input, timed around the calls `score_embeddings` / `score_timelines`
    make (the forward split at the sparse arch)."""
    model, times, rows = loaded.model, defaultdict(float), 0
    writer = None
    chunks = source.chunks(source.shard(0, 1), chunk_rows)
    while True:
        started = time.perf_counter()
        chunk = next(chunks, None)
        times["read"] += time.perf_counter() - started
        if chunk is None:
            break
        chunk_start = time.perf_counter()
        kjt = (timelines_to_kjt if source.timelines else features_to_kjt)(chunk, loaded.config.features)
        times["kjt"] += time.perf_counter() - chunk_start
        with loaded.autocast():
            t = time.perf_counter()
            sparse = model.sparse_arch(kjt)
            times["sparse"] += time.perf_counter() - t
            t = time.perf_counter()
            if name == "teacher_logits":  # GemModel.logits: the interaction arch and heads
                model._logits(kjt, sparse)
            elif name == "user_embeddings":
                F.normalize(
                    model.user_tower(
                        torch.cat([sparse.pooled[n] for n in model.user_features] + [sparse.seq_mean], dim=1)
                    ),
                    dim=1,
                )
            else:
                F.normalize(model.ad_tower(torch.cat([sparse.pooled[n] for n in model.ad_features], dim=1)), dim=1)
        forward_done = time.perf_counter()
        times["dense"] += forward_done - t
        # The job's own call, less the phases above (the same work again), is the output conversion.
        t = time.perf_counter()
        table = (
            score_timelines(loaded, chunk, ds)
            if name == "teacher_logits"
            else score_embeddings(loaded, chunk, "user_id" if name == "user_embeddings" else "ad_id", ds)
        )
        times["convert"] += max(time.perf_counter() - t - (forward_done - chunk_start), 0.0)
        t = time.perf_counter()
        if writer is None:
            writer = pq.ParquetWriter(out / f"{name}.parquet", table.schema)
        writer.write_table(table)
        times["write"] += time.perf_counter() - t
        rows += table.num_rows
    if writer is not None:
        writer.close()
    return dict(times), rows


@torch.inference_mode()
def top_operators(loaded, source, chunk_rows: int, chunks: int = 5, top: int = 15) -> tuple[str, float]:
    """torch.profiler's table of the impressions' forward over `chunks` chunks of timelines, and its FLOPs per
    impression."""
    tables = [c for _, c in zip(range(chunks), source.chunks(source.shard(0, 1), chunk_rows))]
    kjts = [timelines_to_kjt(t, loaded.config.features) for t in tables]
    with loaded.autocast():
        flops = sum(count_flops(lambda k=kjt: loaded.model.logits(k))[0] for kjt in kjts)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for kjt in kjts:
                loaded.model.logits(kjt)
    impressions = sum(k.stride() for k in kjts)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top), flops / impressions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-version", required=True)
    parser.add_argument("--ds", type=date.fromisoformat, required=True)
    parser.add_argument("--chunk-rows", type=int, default=ExportConfig().chunk_rows)
    parser.add_argument("--fp32", action="store_true", help="score in float32 even where export.bf16 would not")
    args = parser.parse_args(argv)
    paths = GemPaths.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        startup = startup_seconds()
        started = time.perf_counter()
        loaded = load_model(paths.model_dir(args.model_version), bf16=ExportConfig().bf16 and not args.fp32)
        load = time.perf_counter() - started
        users = users_input(paths, loaded, args.ds, Path(tmp) / "users")
        inputs = scoring_inputs(paths, loaded, args.ds, users)
        per_input = {
            name: profile_input(loaded, name, source, args.ds, args.chunk_rows, Path(tmp))
            for name, source in inputs.items()
        }
        operators, flops_per_row = top_operators(loaded, inputs["teacher_logits"], args.chunk_rows)
    peaks = {str(dtype).removeprefix("torch."): matmul_peak(dtype) for dtype in (torch.float32, torch.bfloat16)}
    total_rows = sum(rows for _, rows in per_input.values())
    work = {p: sum(times.get(p, 0.0) for times, _ in per_input.values()) for p in PHASES}
    total = startup + load + sum(work.values())
    print(
        f"threads {torch.get_num_threads()}, chunk {args.chunk_rows} rows, bf16 {loaded.bf16}, "
        f"{total_rows:,} rows in 3 tables\n"
    )
    print("| phase | seconds | share |")
    print("|---|---|---|")
    for phase, seconds in (("start-up (import torch, torchrec)", startup), ("model load", load), *work.items()):
        print(f"| {phase} | {seconds:.2f} | {seconds / total:.0%} |")
    print(f"| **total** | **{total:.2f}** | {total_rows / total:,.0f} rows/s |\n")
    print("| input | rows | " + " | ".join(PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    for name, (times, rows) in per_input.items():
        print(f"| {name} | {rows:,} | " + " | ".join(f"{times.get(p, 0.0):.2f}" for p in PHASES) + " |")
    impressions, times = per_input["teacher_logits"][1], per_input["teacher_logits"][0]
    achieved = flops_per_row * impressions / (times["sparse"] + times["dense"])
    print(
        f"\nThe impressions' forward: {flops_per_row / 1e6:.2f} MFLOP a row (matmuls and attention), "
        f"{achieved / 1e9:.1f} GFLOP/s; matmul peak "
        + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s ({achieved / v:.1%})" for k, v in peaks.items())
    )
    print("\nTop operators of the impressions' forward (torch.profiler, 5 chunks):\n")
    print(operators)
    print(
        json.dumps(
            {
                "rows": total_rows,
                "bf16": loaded.bf16,
                "chunk_rows": args.chunk_rows,
                "startup_s": startup,
                "load_s": load,
                "flops_per_impression": flops_per_row,
                "forward_flops_per_second": achieved,
                "peak_flops_per_second": peaks,
                **{f"{p}_s": s for p, s in work.items()},
                "inputs": {n: {"rows": r, **t} for n, (t, r) in per_input.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
