"""Distributed training of GemModel: TorchRec DMP for the sparse tables, DDP for the dense part.

Runs inside each torchrun worker (see `jobs/train.py`). Embedding tables are sharded by
DistributedModelParallel with the planner's plan and updated by a fused row-wise Adagrad in the
backward pass; the dense arches are data-parallel with Adam and gradient clipping. Rank 0 alone
logs and writes the manifest; every rank takes part in the checkpoint (torch.distributed.checkpoint).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

from gem_model.config import GemConfig
from gem_model.data.loader import Batch, ExampleStream
from gem_model.models.gem import GemModel, GemOutput
from gem_model.models.train_wrapper import GemTrain, esmm_probabilities
from gem_model.train.metrics import binary_metrics

Log = Callable[[str], None]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    device: torch.device
    backend: str


def init_distributed() -> DistEnv:
    """Join the torchrun process group: nccl on CUDA, gloo otherwise; works single-process too."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # plain `python jobs/train.py`: a world of one
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
        dist.init_process_group(backend=backend)
    return DistEnv(dist.get_rank(), dist.get_world_size(), device, backend)


def build_sharded_model(cfg: GemConfig, env: DistEnv) -> tuple[DistributedModelParallel, CombinedOptimizer]:
    torch.manual_seed(cfg.train.seed)  # same dense init on every rank; DDP also broadcasts it
    train_module = GemTrain(GemModel(cfg.features, cfg.model, device=torch.device("meta")), cfg.train)
    apply_optimizer_in_backward(
        RowWiseAdagrad, train_module.model.sparse_arch.parameters(), {"lr": cfg.train.sparse_lr}
    )
    dmp = DistributedModelParallel(
        module=train_module, env=ShardingEnv.from_process_group(dist.group.WORLD), device=env.device
    )
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=cfg.train.dense_lr),
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def _forward(dmp: DistributedModelParallel, batch: Batch, device: torch.device) -> tuple[torch.Tensor, GemOutput]:
    return dmp(batch.features.to(device), batch.clicked.to(device), batch.converted.to(device), batch.valid.to(device))


def train_epochs(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, stream: ExampleStream,
                 cfg: GemConfig, env: DistEnv, log: Log) -> list[float]:
    """Train for cfg.train.epochs; returns the mean loss of each epoch (rank 0's shard)."""
    dense_params = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    epoch_losses = []
    steps_total, step, started = len(stream) * cfg.train.epochs, 0, time.monotonic()
    for epoch in range(cfg.train.epochs):
        dmp.train()
        stream.set_epoch(epoch)
        losses = []
        for batch in stream:
            loss, _ = _forward(dmp, batch, env.device)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(dense_params, max_norm=1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
            step += 1
            if env.rank == 0 and (step % 20 == 0 or step == steps_total):
                elapsed = time.monotonic() - started
                rate = step * cfg.train.batch_size * env.world_size / elapsed
                eta = (steps_total - step) * elapsed / step
                log(f"epoch {epoch} step {step}/{steps_total} loss {np.mean(losses[-20:]):.4f} "
                    f"{rate:,.0f} examples/s ETA {eta:.0f}s")
        epoch_losses.append(float(np.mean(losses)))
    return epoch_losses


@torch.no_grad()
def predict(dmp: DistributedModelParallel, stream: ExampleStream, env: DistEnv) -> pa.Table | None:
    """Score every valid row of `stream` on every rank; rank 0 gets all rows, others None."""
    dmp.eval()
    parts = []
    for batch in stream:
        _, out = _forward(dmp, batch, env.device)
        p_ctr, p_ctcvr = esmm_probabilities(out.logits.float())
        keep = batch.valid.numpy()
        table = batch.table.filter(pa.array(keep))
        parts.append(table.append_column("pred_ctr", pa.array(p_ctr.cpu().numpy()[keep]))
                     .append_column("pred_ctcvr", pa.array(p_ctcvr.cpu().numpy()[keep])))
    local = pa.concat_tables(parts) if parts else None
    gathered: list[pa.Table | None] = [None] * env.world_size
    dist.all_gather_object(gathered, local)
    if env.rank != 0:
        return None
    return pa.concat_tables([t for t in gathered if t is not None and t.num_rows])


def holdout_metrics(scored: pa.Table) -> dict[str, float]:
    """AUC / NE / calibration per task, overall and per surface, with the oracle's beside them.

    ctr is evaluated on all impressions; cvr (P(conversion | click)) on clicked impressions, with
    the model's conditional prediction pred_ctcvr / pred_ctr.
    """
    metrics: dict[str, float] = {}
    surfaces = [None, *sorted(set(scored.column("surface").to_pylist()))]
    for surface in surfaces:
        rows = scored if surface is None else scored.filter(pc.equal(scored["surface"], surface))
        prefix = "" if surface is None else f"{surface}/"
        clicked = rows.column("clicked").to_numpy(zero_copy_only=False)
        converted = rows.column("converted").to_numpy(zero_copy_only=False)
        pred_ctr = rows.column("pred_ctr").to_numpy()
        pred_cvr = rows.column("pred_ctcvr").to_numpy() / np.maximum(pred_ctr, 1e-7)
        tasks = {"ctr": (clicked, pred_ctr, None), "cvr": (converted[clicked], pred_cvr[clicked], clicked)}
        for task, (labels, probs, mask) in tasks.items():
            for name, value in binary_metrics(labels, probs).items():
                metrics[f"{prefix}{task}/{name}"] = value
            if "p_click" in rows.column_names and rows.column("p_click").null_count == 0:  # known truth
                p_click = rows.column("p_click").to_numpy()
                truth = p_click if task == "ctr" else (rows.column("p_convert").to_numpy() / p_click)[mask]
                oracle = binary_metrics(labels, truth)
                metrics[f"{prefix}{task}/oracle_auc"] = oracle["auc"]
                metrics[f"{prefix}{task}/oracle_ne"] = oracle["ne"]
    return metrics


def save_checkpoint(dmp: DistributedModelParallel, directory: Path) -> None:
    """Collective: every rank writes its shards of the model state (torch.distributed.checkpoint)."""
    dcp.save({"model": dmp.state_dict()}, checkpoint_id=str(directory))


def finite(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics that are defined: a slice without both classes has no AUC, and is left out."""
    return {k: v for k, v in metrics.items() if not math.isnan(v)}
