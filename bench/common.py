"""What the benches share: FLOP counting, the matmul peak, and training a model variant with the real job.

FLOP counting uses torch.utils.flop_counter, plus the CPU attention kernels it leaves out.

torch's FlopCounterMode counts matmuls and the CUDA attention kernels, but not
`_scaled_dot_product_flash_attention_for_cpu` (forward or backward), which is what the sequence arch
runs on a CPU: without these formulas every CPU FLOP figure misses the attention. Counted as torch counts
the CUDA kernels: the executed (padded) shapes, the causal half not discounted.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from dagster_project.resources.launchers import LocalTorchrunLauncher
from gem_model.config import GemConfig
from gem_model.data.loader import TimelineStream
from gem_model.models.gem import GemModel
from gem_model.models.train_wrapper import GemTrain
from gem_model.paths import GemPaths

_aten = torch.ops.aten


@register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu)
def _cpu_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _cpu_attention_backward(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def count_flops(fn: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """(total FLOPs, FLOPs per operator) of one call of `fn`."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops(), {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 10) -> float:
    """FLOP/s of the best of `reps` n x n matmuls in `dtype` with torch's threads: the utilisation denominator."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best


REPO = Path(__file__).resolve().parents[1]  # the repository root: the jobs' working directory
# Each variant's settings over the common config.
VARIANTS: dict[str, dict[str, Any]] = {
    "gem": {},
    "dlrm": {"model": {"architecture": "dlrm"}},
    "dcnv2": {"model": {"architecture": "dcnv2"}},
    # Logistic regression: no retrieval loss either, so nothing but the logits shapes its weights.
    "lr": {"model": {"architecture": "lr"}, "train": {"retrieval_weight": 0.0}},
    "gem-no-wukong": {"model": {"use_wukong": False}},
    "gem-no-sequence": {"model": {"use_sequence": False}},
    # The events without the match signal (attributes in queries and keys, the match counts' token).
    "gem-no-match": {"model": {"sequence": {"match_candidate": False}}},
    # Sliding-window encoding: each event attends to the 64 before it.
    "gem-window64": {"model": {"sequence": {"window": 64}}},
    # The research option (model.experimental): Kunlun's Mixture of Wukong Experts.
    "gem-wukong-experts2": {"model": {"experimental": {"wukong_experts": 2}}},
}


def variant_config(cfg: GemConfig, name: str, seed: int | None = None) -> GemConfig:
    variant = GemConfig.from_dict(VARIANTS[name], base=cfg)
    return variant if seed is None else GemConfig.from_dict({"train": {"seed": seed}}, base=variant)


def variant_version(cfg: GemConfig, name: str, seed: int | None = None) -> str:
    """The model version a variant trains into: the same config always maps to the same directory."""
    return f"bench-{cfg.preset}-{cfg.data.source}-{name}-{variant_config(cfg, name, seed).fingerprint}"


def train_variant(
    cfg: GemConfig, paths: GemPaths, name: str, data_version: int, seed: int | None = None
) -> dict[str, Any]:
    return train(variant_config(cfg, name, seed), paths, variant_version(cfg, name, seed), data_version)


def train(variant: GemConfig, paths: GemPaths, version: str, data_version: int) -> dict[str, Any]:
    """The manifest of model `version` trained from `variant` by the real training job (torchrun), on Delta
    version `data_version` of the training examples; a version already trained is read, not retrained, and only
    if it was trained on `data_version` (bench versions are named by config alone)."""
    config_file = paths.staging / "bench" / f"{version}.json"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(variant.to_json())
    model_dir = paths.model_dir(version)
    if not (model_dir / "manifest.json").is_file():
        launcher, nproc = LocalTorchrunLauncher(), variant.train.nproc
        args = [
            "--config",
            str(config_file),
            "--data",
            str(paths.table("gold.user_timelines")),
            "--data-version",
            str(data_version),
            "--model-dir",
            str(model_dir),
        ]
        subprocess.run(
            launcher.command("jobs.train", args, nproc), check=True, env=launcher.environment(nproc), cwd=REPO
        )
    manifest = json.loads((model_dir / "manifest.json").read_text())
    if (trained_on := manifest["training_data"]["delta_version"]) != data_version:
        raise SystemExit(
            f"{model_dir} was trained on Delta version {trained_on} of gold.user_timelines and the "
            f"table is at version {data_version} now, so its metrics are not this lake's: move the "
            "directory aside to retrain it, or use the GEM_HOME of the lake it was trained on"
        )
    return manifest


def dense_flops_per_example(cfg: GemConfig, paths: GemPaths) -> float:
    stream = TimelineStream(
        paths.table("gold.user_timelines"), cfg.features, cfg.train.batch_size, end=cfg.world.holdout_start
    )
    batch = next(iter(stream))
    torch.manual_seed(0)
    module = GemTrain(GemModel(cfg.features, cfg.model), cfg.train)

    def step() -> None:
        loss, _ = module(batch.features, batch.clicked, batch.converted, batch.valid)
        loss.backward()

    return count_flops(step)[0] / int(batch.valid.sum())
