"""The students' objectives: ESMM label loss and binary knowledge distillation.

Both take logits [B, 2] (click, conversion given click). The label loss supervises conversion on
every impression through the funnel, P(click) * P(conversion | click), as the teacher's does.
Distillation matches each task's probability to a soft target at temperature T (Hinton et al.,
2015, in its binary form), scaled by T^2 so its gradients keep their size as T changes; the
target is the teacher's logit (standard KD) or the Student Adapter's (`gem_model.distill.adapter`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_loss(logits: torch.Tensor, clicked: torch.Tensor, converted: torch.Tensor) -> torch.Tensor:
    """Mean BCE(P(click), clicked) + BCE(P(click) P(conversion | click), converted); labels [B] in {0, 1}."""
    ctr = F.binary_cross_entropy_with_logits(logits[:, 0], clicked)
    log_p = F.logsigmoid(logits[:, 0]) + F.logsigmoid(logits[:, 1])  # log P(click and conversion)
    log_not = torch.log1p(-torch.exp(log_p).clamp(max=1 - 1e-7))
    ctcvr = -(converted * log_p + (1 - converted) * log_not).mean()
    return ctr + ctcvr


def distillation_loss(logits: torch.Tensor, target_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """T^2 * mean over rows of the sum over tasks of BCE(sigmoid(z / T), sigmoid(z_target / T))."""
    if logits.shape != target_logits.shape:
        raise ValueError(f"student logits {tuple(logits.shape)} and target logits {tuple(target_logits.shape)} differ")
    soft = torch.sigmoid(target_logits / temperature)
    per_task = F.binary_cross_entropy_with_logits(logits / temperature, soft, reduction="none")
    return temperature**2 * per_task.sum(dim=1).mean()
