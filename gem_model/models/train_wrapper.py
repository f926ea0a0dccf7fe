"""GemTrain: the training objective around GemModel (the module DistributedModelParallel wraps).

Loss = BCE(ctr, clicked) + BCE(ctr * cvr, converted)  (ESMM: conversion supervised on every
impression through the funnel) + retrieval_weight * in-batch softmax over clicked (user, ad)
pairs, which makes the exported embeddings' inner product rank ads for a user. Padding rows
(`valid` = False) carry zero weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import TrainConfig
from gem_model.models.gem import GemModel, GemOutput


def esmm_probabilities(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, 2] (ctr, cvr) -> (P(click), P(conversion | impression)), each [B]."""
    p_ctr = torch.sigmoid(logits[:, 0])
    return p_ctr, p_ctr * torch.sigmoid(logits[:, 1])


class GemTrain(nn.Module):
    def __init__(self, model: GemModel, config: TrainConfig) -> None:
        super().__init__()
        self.model = model
        self.retrieval_weight = config.retrieval_weight
        self.temperature = config.temperature

    def forward(
        self, features: KeyedJaggedTensor, clicked: torch.Tensor, converted: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, GemOutput]:
        out = self.model(features)
        weight = valid.float()
        n = weight.sum().clamp(min=1.0)
        logits = out.logits.float()
        # In float32 outside autocast: CUDA's bf16 autocast refuses binary_cross_entropy (train.bf16).
        with torch.autocast(logits.device.type, enabled=False):
            _, p_ctcvr = esmm_probabilities(logits)
            ctr_loss = F.binary_cross_entropy_with_logits(logits[:, 0], clicked, reduction="none") * weight
            ctcvr_loss = F.binary_cross_entropy(p_ctcvr.clamp(1e-7, 1 - 1e-7), converted, reduction="none") * weight
            loss = (ctr_loss.sum() + ctcvr_loss.sum()) / n
        pairs = (clicked > 0.5) & valid
        if self.retrieval_weight > 0 and int(pairs.sum()) > 1:
            u, a = out.user_embedding[pairs], out.ad_embedding[pairs]
            scores = u @ a.T / self.temperature
            loss = loss + self.retrieval_weight * F.cross_entropy(scores, torch.arange(len(u), device=u.device))
        else:
            # Same autograd graph on every rank even without pairs (a padding batch): DDP and the
            # sharded embeddings' backward collectives must run in lockstep, or the ranks deadlock.
            loss = loss + 0.0 * (out.user_embedding.sum() + out.ad_embedding.sum())
        return loss, out
