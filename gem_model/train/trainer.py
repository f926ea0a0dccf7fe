"""Distributed training of GemModel: TorchRec DMP for the sparse tables, DDP for the dense part.

Runs inside each torchrun worker (see `jobs/train.py`). Embedding tables are sharded by
DistributedModelParallel with the planner's plan and updated by a fused row-wise Adagrad in the
backward pass; the dense arches are data-parallel (DDP) with Adam and gradient clipping, under
bf16 autocast on CUDA and optionally torch.compile. Every rank takes part in the checkpoints
(torch.distributed.checkpoint, resharded on load, so a resumed run may even change world size);
rank 0 alone logs (stdout, Dagster Pipes, TensorBoard) and writes the manifest.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils.tensorboard import SummaryWriter
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.optim import CombinedOptimizer, KeyedOptimizerWrapper, RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

from gem_model.config import GemConfig, TrainConfig
from gem_model.data.loader import Batch, TimelineStream
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
        if "RANK" in os.environ:
            dist.init_process_group(backend=backend)
        else:  # plain `python -m jobs.train`: a world of one, whose in-process store takes no port
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistEnv(dist.get_rank(), dist.get_world_size(), device, backend)


def build_sharded_model(cfg: GemConfig, env: DistEnv) -> tuple[DistributedModelParallel, CombinedOptimizer]:
    torch.manual_seed(cfg.train.seed)  # same dense init on every rank; DDP also broadcasts it
    model = GemModel(cfg.features, cfg.model, device=torch.device("meta"))
    if cfg.train.compile:
        model.interaction = torch.compile(model.interaction, dynamic=True)
    train_module = GemTrain(model, cfg.train)
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
    torch.manual_seed(cfg.train.seed + env.rank)  # per-rank stream for anything random from here on
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def _forward(
    dmp: DistributedModelParallel, batch: Batch, env: DistEnv, cfg: GemConfig
) -> tuple[torch.Tensor, GemOutput]:
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if cfg.train.bf16 and env.device.type == "cuda" else nullcontext()
    )
    with autocast:
        return dmp(
            batch.features.to(env.device),
            batch.clicked.to(env.device),
            batch.converted.to(env.device),
            batch.valid.to(env.device),
        )


@dataclass
class Progress:
    """Where training stands; saved beside each resumable checkpoint."""

    epoch: int = 0
    step_in_epoch: int = 0
    steps_done: int = 0
    epoch_losses: list[float] = field(default_factory=list)
    loss_sum: float = 0.0  # each of the current epoch's steps so far: its loss x its real rows
    rows_in_epoch: int = 0  # real (not padding) rows of the current epoch's steps so far

    def record_step(self, loss: float, rows: int) -> None:
        """One step's mean loss over its `rows` real rows; a step of padding alone (rows 0) weighs nothing."""
        self.loss_sum += loss * rows
        self.rows_in_epoch += rows
        self.step_in_epoch, self.steps_done = self.step_in_epoch + 1, self.steps_done + 1

    @property
    def epoch_loss(self) -> float:
        """The current epoch's mean loss over its real rows so far."""
        return self.loss_sum / max(self.rows_in_epoch, 1)

    def end_epoch(self) -> None:
        """Close the epoch: its loss is the mean over its real rows, not over its steps."""
        self.epoch_losses.append(self.epoch_loss)
        self.epoch, self.step_in_epoch, self.loss_sum, self.rows_in_epoch = self.epoch + 1, 0, 0.0, 0


@dataclass(frozen=True)
class TrainResult:
    epoch_losses: list[float]
    examples_per_second: float  # all ranks together, padding rows included, over this launch's steps


class Checkpoints:
    """Resumable checkpoints under `root`/step-<N>: DCP shards of model + optimizers from every
    rank, then `progress.json` from rank 0 once all shards are written, which marks it complete.
    Only the newest complete checkpoint is kept; a half-written one is ignored and replaced."""

    def __init__(self, root: Path, fingerprint: str) -> None:
        self.root, self.fingerprint = root, fingerprint

    def latest(self) -> tuple[Path, Progress] | None:
        for directory in sorted(self.root.glob("step-*"), reverse=True):
            marker = directory / "progress.json"
            if marker.is_file():
                data = json.loads(marker.read_text())
                if data.pop("config_fingerprint") != self.fingerprint:
                    raise ValueError(
                        f"checkpoint {directory} was written by another config; delete {self.root} to start over"
                    )
                return directory, Progress(**data)
        return None

    def save(
        self, dmp: DistributedModelParallel, optimizer: CombinedOptimizer, progress: Progress, env: DistEnv
    ) -> Path:
        directory = self.root / f"step-{progress.steps_done:08d}"
        dcp.save({"model": dmp.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(directory))
        dist.barrier()
        if env.rank == 0:
            record = {**dataclasses.asdict(progress), "config_fingerprint": self.fingerprint}
            (directory / "progress.json").write_text(json.dumps(record))
            for older in self.root.glob("step-*"):
                if older != directory:
                    shutil.rmtree(older, ignore_errors=True)
        dist.barrier()
        return directory

    @staticmethod
    def load(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, directory: Path) -> None:
        optimizer.init_state()  # the state tensors DCP loads into (Adam's are created lazily otherwise)
        state = {"model": dmp.state_dict(), "optimizer": optimizer.state_dict()}
        dcp.load(state, checkpoint_id=str(directory))
        dmp.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


def dense_lr(tc: TrainConfig, step: int, steps_total: int) -> float:
    """The dense learning rate of step `step` (0-based) of `steps_total`."""
    if tc.dense_lr_schedule == "constant":
        return tc.dense_lr
    floor = tc.dense_lr * tc.min_lr_fraction
    return floor + (tc.dense_lr - floor) * 0.5 * (1 + math.cos(math.pi * step / max(steps_total - 1, 1)))


def train_epochs(
    dmp: DistributedModelParallel,
    optimizer: CombinedOptimizer,
    stream: TimelineStream,
    cfg: GemConfig,
    env: DistEnv,
    log: Log,
    checkpoints: Checkpoints,
    writer: SummaryWriter | None = None,
) -> TrainResult:
    """Train for cfg.train.epochs, resuming from the newest complete checkpoint if there is one.

    Batches are deterministic per (seed, rank, epoch), so a resumed run skips the batches already
    trained on and continues exactly where the checkpoint was taken. Returns the mean loss of
    each epoch over rank 0's real rows (padding excluded) and this launch's throughput.
    """
    tc = cfg.train
    dense_params = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    dense_optimizer = next(opt for _, opt in optimizer.optimizers if opt is not dmp.fused_optimizer)
    progress = Progress()
    resumed = checkpoints.latest()
    if resumed is not None:
        Checkpoints.load(dmp, optimizer, resumed[0])
        progress = resumed[1]
        log(f"resumed from {resumed[0]} (epoch {progress.epoch}, step {progress.steps_done})")
    steps_total = len(stream) * tc.epochs
    started, start_step = time.monotonic(), progress.steps_done
    while progress.epoch < tc.epochs:
        dmp.train()
        stream.set_epoch(progress.epoch)
        for i, batch in enumerate(stream):
            if i < progress.step_in_epoch:
                continue  # trained on before the checkpoint
            loss, _ = _forward(dmp, batch, env, cfg)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(dense_params, max_norm=tc.grad_clip)
            for group in dense_optimizer.param_groups:  # a function of the step: resumes exactly
                group["lr"] = dense_lr(tc, progress.steps_done, steps_total)
            optimizer.step()
            progress.record_step(float(loss.detach()), int(batch.valid.sum()))
            step = progress.steps_done
            if env.rank == 0 and (step % tc.log_every_steps == 0 or step == steps_total):
                elapsed = time.monotonic() - started
                rate = (step - start_step) * tc.batch_size * env.world_size / elapsed
                eta = (steps_total - step) * elapsed / (step - start_step)
                # The epoch's running mean: a step of padding alone has loss 0 and would log as 0.0000.
                log(
                    f"epoch {progress.epoch} step {step}/{steps_total} loss {progress.epoch_loss:.4f} "
                    f"{rate:,.0f} examples/s ETA {eta:.0f}s"
                )
                if writer is not None:
                    writer.add_scalar("train/loss", progress.epoch_loss, step)
                    writer.add_scalar("train/examples_per_second", rate, step)
            if step % tc.checkpoint_every_steps == 0 and step < steps_total:
                checkpoints.save(dmp, optimizer, progress, env)
        progress.end_epoch()
    seconds = time.monotonic() - started
    examples = (progress.steps_done - start_step) * tc.batch_size * env.world_size
    return TrainResult(progress.epoch_losses, examples / seconds if seconds > 0 else math.nan)


@torch.no_grad()
def predict(dmp: DistributedModelParallel, stream: TimelineStream, env: DistEnv, cfg: GemConfig) -> pa.Table | None:
    """Score every valid row of `stream` on every rank; rank 0 gets all rows, others None."""
    dmp.eval()
    parts = []
    for batch in stream:
        _, out = _forward(dmp, batch, env, cfg)
        p_ctr, p_ctcvr = esmm_probabilities(out.logits.float())
        keep = batch.valid.numpy()
        table = batch.table.filter(pa.array(keep))
        parts.append(
            table.append_column("pred_ctr", pa.array(p_ctr.cpu().numpy()[keep])).append_column(
                "pred_ctcvr", pa.array(p_ctcvr.cpu().numpy()[keep])
            )
        )
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
