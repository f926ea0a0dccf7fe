"""Where a GEM training step spends its time: torch.profiler over real steps, grouped by kind of work.

    GEM_HOME=lakehouse-small python -m bench.perf.train_profile --preset small

One rank as `jobs/train.py` runs it (TorchRec DistributedModelParallel in a one-process gloo group,
fbgemm's fused row-wise Adagrad in the backward, Adam on the dense part, one torch thread as each of
the 2 local ranks gets), on `--steps` batches of `gold.training_examples` after 3 warm-up steps.
Every operator's self CPU time is put in one group: data (the loader building the batch), embedding
lookups and their update (fbgemm), attention forward and backward (the CPU flash kernel), dense
matmuls (mm, addmm, bmm), jagged bookkeeping (gathers, scatters, concatenation, copies), elementwise
and normalisation, optimizer, and the rest; Python and dispatch overhead is the step's wall time
minus the operators' self time. Prints a Markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from gem_model.config import GemConfig
from gem_model.data.loader import TimelineStream
from gem_model.paths import GemPaths
from gem_model.train.trainer import _forward, build_sharded_model, init_distributed

GROUPS = {
    "embedding lookups and update (fbgemm)": ("fbgemm", "embedding"),
    "attention (CPU flash kernel, fwd + bwd)": ("scaled_dot_product",),
    "dense matmuls": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear"),
    "jagged bookkeeping (gather, scatter, cat, copy)": (
        "index",
        "scatter",
        "aten::cat",
        "copy_",
        "gather",
        "nonzero",
        "repeat_interleave",
        "cumsum",
        "aten::sort",
        "masked",
    ),
    "elementwise and normalisation": (
        "add",
        "mul",
        "div",
        "sub",
        "silu",
        "sigmoid",
        "norm",
        "fill_",
        "sum",
        "exp",
        "where",
        "clamp",
        "neg",
        "pow",
        "sqrt",
        "mean",
        "binary_cross",
    ),
    "optimizer": ("optim", "adam", "_foreach"),
}


def group_of(name: str) -> str:
    lowered = name.lower()
    for group, keys in GROUPS.items():
        if any(key.lower() in lowered for key in keys):
            return group
    return "other operators"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--config", help="overrides, as for the training job")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = GemConfig.load(args.preset, args.config)
    paths = GemPaths.from_env()
    env = init_distributed()
    dmp, optimizer = build_sharded_model(cfg, env)
    stream = iter(
        TimelineStream(
            paths.table("gold.user_timelines"),
            cfg.features,
            cfg.train.batch_size,
            end=cfg.world.holdout_start,
            shuffle_buffer=cfg.train.batch_size * 8,
        )
    )
    dmp.train()

    def step() -> None:
        loss, _ = _forward(dmp, batch, env, cfg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(3):
        batch = next(stream)
        step()
    data_seconds = 0.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for _ in range(args.steps):
            t = time.perf_counter()
            batch = next(stream)
            data_seconds += time.perf_counter() - t
            step()
        wall = time.perf_counter() - started
    groups: dict[str, float] = defaultdict(float)
    top: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for event in prof.key_averages():
        if event.key.startswith(("ProfilerStep", "Optimizer.step", "Optimizer.zero_grad", "autograd::")):
            continue  # wrappers: their self time is what Python spent in them, counted as overhead below
        seconds = event.self_cpu_time_total / 1e6
        groups[group_of(event.key)] += seconds
        top[group_of(event.key)].append((seconds, event.key))
    ops = sum(groups.values())
    groups["data (loader: Arrow to KJT)"] = data_seconds
    groups["Python and dispatch overhead (wall - operators - data)"] = max(wall - ops - data_seconds, 0.0)
    per_step = {k: v / args.steps for k, v in groups.items()}
    examples = cfg.train.batch_size * args.steps / wall
    print(
        f"\n{args.preset}, batch {cfg.train.batch_size}, {args.threads} thread(s), {args.steps} steps: "
        f"{1e3 * wall / args.steps:.0f} ms a step, {examples:,.0f} examples/s on this rank (profiler on)\n"
    )
    print("| group | ms a step | share | largest operators (ms a step) |\n|---|---|---|---|")
    for name, seconds in sorted(per_step.items(), key=lambda kv: -kv[1]):
        largest = ", ".join(
            f"`{op.removeprefix('aten::')}` {1e3 * t / args.steps:.1f}"
            for t, op in sorted(top.get(name, []), reverse=True)[:3]
        )
        print(f"| {name} | {1e3 * seconds:.1f} | {seconds * args.steps / wall:.0%} | {largest} |")
    print(
        json.dumps(
            {
                "preset": args.preset,
                "batch": cfg.train.batch_size,
                "threads": args.threads,
                "step_ms": 1e3 * wall / args.steps,
                "groups_ms": {k: 1e3 * v for k, v in per_step.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
