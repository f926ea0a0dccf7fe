"""StudentModel: the small per-surface (vertical) model, an EmbeddingBagCollection and an MLP.

SparseArch: one TorchRec table per single-valued feature of `student.features` (rows from the
shared `FeatureSpec` buckets, hashed or by modulo, so the students read the same `<feature>_idx`
columns as the teacher). OverArch: an MLP over the pooled embeddings and the optional dense inputs (the
teacher's user and ad embeddings and their inner product) to two logits, click and conversion
given click, combined ESMM-style as in the teacher. Single process, no sharding: a student is a
few hundred thousand parameters and must score a thousand impressions in a few milliseconds.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import SparseFeature, StudentConfig
from gem_model.modules.mlp import mlp


def sparse_input(ids: torch.Tensor, keys: list[str]) -> KeyedJaggedTensor:
    """ids [B, F] int64 (one row per feature in `keys`' order) -> a KJT with one id per (feature, row)."""
    batch, n_features = ids.shape
    if n_features != len(keys):
        raise ValueError(f"ids has {n_features} feature columns, the student has {len(keys)}: {keys}")
    return KeyedJaggedTensor(
        keys=keys, values=ids.T.reshape(-1), lengths=torch.ones(batch * n_features, dtype=torch.int64)
    )


def embedding_inputs(user: np.ndarray, ad: np.ndarray) -> np.ndarray:
    """[N, 2R + 1]: the teacher's user and ad embeddings and their inner product (the retrieval score)."""
    return np.concatenate([user, ad, np.sum(user * ad, axis=1, keepdims=True)], axis=1).astype(np.float32)


class StudentModel(nn.Module):
    def __init__(self, features: tuple[SparseFeature, ...], cfg: StudentConfig, dense_dim: int) -> None:
        super().__init__()
        self.keys = [f.name for f in features]
        self.dense_dim = dense_dim
        self.sparse_arch = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=f"t_{f.name}",
                    num_embeddings=f.buckets,
                    embedding_dim=cfg.embedding_dim,
                    feature_names=[f.name],
                    pooling=PoolingType.SUM,
                )
                for f in features
            ],
        )
        self.over_arch = mlp(len(features) * cfg.embedding_dim + dense_dim, cfg.dense_dims, 2)

    def init_base_rates(self, ctr: float, cvr: float) -> None:
        """Start the output biases at the base rates' logits: the first steps learn ranking, not the mean."""
        rates = torch.tensor([ctr, cvr]).clamp(1e-4, 1 - 1e-4)
        with torch.no_grad():
            self.over_arch[-1].bias.copy_(torch.logit(rates))

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """ids [B, F] int64, dense [B, dense_dim] -> logits [B, 2] (ctr, cvr given click)."""
        if dense.shape[1] != self.dense_dim:
            raise ValueError(f"dense input has {dense.shape[1]} columns, the student was built for {self.dense_dim}")
        pooled = self.sparse_arch(sparse_input(ids, self.keys)).values()  # [B, F * D]
        return self.over_arch(torch.cat([pooled, dense], dim=1))

    @torch.no_grad()
    def predict(self, ids: np.ndarray, dense: np.ndarray, batch_rows: int = 4096) -> np.ndarray:
        """logits [N, 2] of every row, in eval mode."""
        self.eval()
        parts = [
            self(torch.from_numpy(ids[i : i + batch_rows]), torch.from_numpy(dense[i : i + batch_rows]))
            for i in range(0, len(ids), batch_rows)
        ]
        return torch.cat(parts).numpy() if parts else np.zeros((0, 2), np.float32)


@torch.no_grad()
def inference_ms_per_1000(model: StudentModel, ids: np.ndarray, dense: np.ndarray, repeats: int = 20) -> float:
    """Median wall milliseconds to score 1,000 rows (a batch of 1,000, KJT built inside), after warm-up."""
    model.eval()
    n = min(1000, len(ids))
    if n == 0:
        return float("nan")
    batch_ids, batch_dense = torch.from_numpy(ids[:n]), torch.from_numpy(dense[:n])
    for _ in range(3):
        model(batch_ids, batch_dense)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        model(batch_ids, batch_dense)
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1000.0 * 1000 / n
