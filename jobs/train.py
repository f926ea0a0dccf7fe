"""Distributed training of the GEM teacher; one process per rank under torchrun.

Local, 2 CPU processes (gloo)::

    torchrun --standalone --nproc-per-node 2 -m jobs.train --config CONFIG.json \\
        --data $GEM_HOME/lake/gold/user_timelines --data-version 3 --model-dir $GEM_HOME/models/V

Multi-node: run the same command on each node with `--nnodes N --node-rank I
--rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id JOB` instead of `--standalone`
(nccl is chosen automatically on CUDA). Single process: `python -m jobs.train ...`.

Training uses the days before `world.holdout_start` (the last `train.window_days` of them when set);
metrics are computed on the holdout days. When launched by Dagster Pipes, rank 0 streams its log lines
and the final metrics to the Dagster run; it also writes TensorBoard events to
`<model-dir>/tensorboard` (`tensorboard --logdir`).

Every `train.checkpoint_every_steps` steps all ranks write a resumable checkpoint under
`<model-dir>.partial/resume`; launching the same command again after a crash or a kill resumes
from the newest complete one and ends with the metrics an uninterrupted run would have. The
model directory itself appears only when training has finished (renamed from `.partial`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

from gem_model.config import GemConfig
from gem_model.data.loader import TimelineStream
from gem_model.integrity import file_digests
from gem_model.pipes import open_pipes
from gem_model.train.trainer import (
    Checkpoints,
    build_sharded_model,
    finite,
    holdout_metrics,
    init_distributed,
    predict,
    save_checkpoint,
    train_epochs,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="resolved GemConfig as JSON")
    parser.add_argument("--data", type=Path, required=True, help="gold.user_timelines Delta table path")
    parser.add_argument("--data-version", type=int, required=True, help="Delta version to train on")
    parser.add_argument("--model-dir", type=Path, required=True, help="output: $GEM_HOME/models/<version>")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = GemConfig.from_dict(json.loads(args.config.read_text()))
    env = init_distributed()
    with open_pipes(reports=env.rank == 0) as pipes:

        def log(message: str) -> None:
            if env.rank != 0:
                return
            print(message, flush=True)
            if pipes is not None:
                pipes.log.info(message)

        started = time.monotonic()
        holdout, start = cfg.world.holdout_start, cfg.train_start
        common = dict(
            path=args.data,
            spec=cfg.features,
            batch_size=cfg.train.batch_size,
            rank=env.rank,
            world_size=env.world_size,
            version=args.data_version,
        )
        train_stream = TimelineStream(
            **common, start=start, end=holdout, shuffle_buffer=8 * cfg.train.batch_size, seed=cfg.train.seed
        )
        holdout_stream = TimelineStream(**common, start=holdout)
        log(
            f"rank 0 of {env.world_size} ({env.backend}); {train_stream.total_rows} training impressions from "
            f"{start or 'the first day'} to before {holdout}, {holdout_stream.total_rows} holdout impressions, "
            f"Delta version {args.data_version}"
        )

        dmp, optimizer = build_sharded_model(cfg, env)
        plan = {
            name: {t: s.sharding_type for t, s in module_plan.items()} for name, module_plan in dmp.plan.plan.items()
        }
        log(f"sharding plan: {plan}")
        model_dir = args.model_dir
        # Kept across launches: a re-run of the same version (same config and data) resumes here.
        staging = model_dir.with_name(model_dir.name + ".partial")
        writer = SummaryWriter(str(staging / "tensorboard")) if env.rank == 0 else None
        checkpoints = Checkpoints(staging / "resume", cfg.fingerprint)
        result = train_epochs(dmp, optimizer, train_stream, cfg, env, log, checkpoints, writer)
        epoch_losses = result.epoch_losses
        scored = predict(dmp, holdout_stream, env, cfg)

        if env.rank == 0:
            shutil.rmtree(staging / "checkpoint", ignore_errors=True)
        dist.barrier()
        save_checkpoint(dmp, staging / "checkpoint")
        dist.barrier()
        if env.rank == 0:
            metrics = finite(holdout_metrics(scored))
            manifest = {
                "model_version": model_dir.name,
                "created_at": datetime.now(UTC).isoformat(),
                "config": cfg.to_dict(),
                "training_data": {
                    "table": "gold.user_timelines",
                    "path": str(args.data),
                    "delta_version": args.data_version,
                    "train_days": [str(d) for d in cfg.world.days if (start is None or d >= start) and d < holdout],
                    "holdout_days": [str(d) for d in cfg.world.days if d >= holdout],
                },
                "world_size": env.world_size,
                "checkpoint_files": file_digests(staging / "checkpoint"),
                "sharding_plan": plan,
                "epoch_losses": epoch_losses,
                "train_seconds": time.monotonic() - started,
                "train_examples_per_second": result.examples_per_second,
                "metrics": metrics,
            }
            (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
            for name, value in metrics.items():
                writer.add_scalar(f"holdout/{name}", value, len(epoch_losses))
            writer.close()
            shutil.rmtree(staging / "resume", ignore_errors=True)
            shutil.rmtree(model_dir, ignore_errors=True)
            staging.rename(model_dir)  # the model directory appears complete or not at all
            headline = {k: metrics[k] for k in ("ctr/auc", "ctr/ne", "cvr/auc", "cvr/ne") if k in metrics}
            log(f"holdout metrics: {json.dumps(headline)}; wrote {model_dir}")
            if pipes is not None:
                pipes.report_asset_materialization(
                    metadata={
                        "model_version": model_dir.name,
                        **headline,
                        "epoch_losses": {"raw_value": epoch_losses, "type": "json"},
                    },
                    data_version=model_dir.name,
                )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
