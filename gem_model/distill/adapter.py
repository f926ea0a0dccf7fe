"""The Student Adapter: a small model that maps the teacher's prediction and context to the outcome.

The teacher is trained on a window that ends before the students' days, so its predictions go
stale: in the synthetic world every ad's click logit drifts linearly (`Source.drift`), and the
teacher has seen none of the new days. The adapter is fit on the freshest labelled days of the
students' window and, per task, re-calibrates the teacher's logit z:

    z' = scale[surface] * z + bias[surface] + sum_f offset_f[id_f]      (f in student.adapter_features)

i.e. a per-surface calibration plus per-id (ad, advertiser) logit offsets, which is exactly the
shape of the drift. It is a logistic regression with Gaussian priors: per-id offsets have a
standard deviation chosen per task from `student.adapter_prior_sds` by held-out log loss, so an
id seen a few times is shrunk toward the teacher and one seen often moves to its observed rate;
the per-surface terms get a weak prior of one logit around the identity. The objective is
convex, fit full-batch with L-BFGS, so the fit is deterministic. Its output, not the raw
teacher's, is the distillation target of the `adapter` students. The click adapter is fit on
every impression, the conversion adapter on clicked ones (its label is conversion given click).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Prior standard deviation (logits) of the per-surface scale around 1 and bias around 0: weak,
# these have thousands of rows each, but it keeps a surface with a handful of rows at the identity.
SURFACE_PRIOR_SD = 1.0


class StudentAdapter(nn.Module):
    def __init__(self, surfaces: tuple[str, ...], id_buckets: dict[str, int]) -> None:
        super().__init__()
        self.surfaces, self.id_names = surfaces, list(id_buckets)
        self.scale = nn.Parameter(torch.ones(len(surfaces)))
        self.bias = nn.Parameter(torch.zeros(len(surfaces)))
        self.offsets = nn.ModuleDict({name: nn.Embedding(buckets, 1) for name, buckets in id_buckets.items()})
        for table in self.offsets.values():
            nn.init.zeros_(table.weight)

    def surface_index(self, surface: np.ndarray) -> torch.Tensor:
        lookup = {s: i for i, s in enumerate(self.surfaces)}
        unknown = sorted(set(surface.tolist()) - set(lookup))
        if unknown:
            raise ValueError(f"surfaces {unknown} are not in the adapter's {list(self.surfaces)} (world.surfaces)")
        return torch.tensor([lookup[s] for s in surface.tolist()], dtype=torch.int64)

    def forward(self, teacher_logit: torch.Tensor, surface: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """teacher_logit [B], surface [B] (index into `surfaces`), ids [B, K] in `id_names` order -> logits [B]."""
        out = self.scale[surface] * teacher_logit + self.bias[surface]
        for k, name in enumerate(self.id_names):
            out = out + self.offsets[name](ids[:, k]).squeeze(1)
        return out

    def penalty(self, prior_sd: float) -> torch.Tensor:
        """Negative log prior (up to a constant) of the parameters."""
        surface = ((self.scale - 1) ** 2).sum() + (self.bias**2).sum()
        offsets = sum((table.weight**2).sum() for table in self.offsets.values())
        return surface / (2 * SURFACE_PRIOR_SD**2) + offsets / (2 * prior_sd**2)

    @torch.no_grad()
    def adapt(self, teacher_logit: np.ndarray, surface: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The adapted logits [N] of numpy inputs (surface as strings)."""
        return self(
            torch.from_numpy(teacher_logit.astype(np.float32)),
            self.surface_index(surface),
            torch.tensor(ids, dtype=torch.int64),
        ).numpy()


def fit_adapter(
    adapter: StudentAdapter,
    teacher_logit: np.ndarray,
    surface: np.ndarray,
    ids: np.ndarray,
    labels: np.ndarray,
    prior_sd: float,
    max_iter: int = 200,
) -> dict[str, float]:
    """MAP fit of `adapter` on one window's rows; returns its mean log loss before and after (in-sample)."""
    if len(labels) == 0:
        raise ValueError("the Student Adapter has no rows to fit on; check the adapter days have impressions")
    z = torch.from_numpy(teacher_logit.astype(np.float32))
    s, x = adapter.surface_index(surface), torch.tensor(ids, dtype=torch.int64)
    y = torch.from_numpy(labels.astype(np.float32))
    optimizer = torch.optim.LBFGS(
        adapter.parameters(),
        max_iter=max_iter,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
    )

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(adapter(z, s, x), y) + adapter.penalty(prior_sd) / len(y)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(objective)
    with torch.no_grad():
        before = float(F.binary_cross_entropy_with_logits(z, y))
        after = float(F.binary_cross_entropy_with_logits(adapter(z, s, x), y))
    return {"rows": float(len(y)), "positives": float(y.sum()), "log_loss_teacher": before, "log_loss_adapted": after}


def fit_adapter_with_prior_choice(
    make: Callable[[], StudentAdapter],
    teacher_logit: np.ndarray,
    surface: np.ndarray,
    ids: np.ndarray,
    labels: np.ndarray,
    prior_sds: tuple[float, ...],
    holdout_fraction: float,
    seed: int,
) -> tuple[StudentAdapter, dict[str, Any]]:
    """Choose the per-id prior by held-out log loss, then refit on every row.

    How far the ids have drifted is a property of the data, not a constant: on `small` the click
    adapter wants a prior of 0.5-1.0 logit (the ads' trends), the conversion adapter one of 0.1
    (conversions do not drift; a loose prior fits noise and made the adapted teacher's conversion
    NE 0.009 worse than the raw teacher's). Each candidate is fit on all but a seeded
    `holdout_fraction` of the rows and scored on the rest.
    """
    order = np.random.default_rng(seed).permutation(len(labels))
    held, kept = order[: round(len(order) * holdout_fraction)], order[round(len(order) * holdout_fraction) :]
    if len(held) == 0 or len(kept) == 0:
        raise ValueError(
            f"the Student Adapter has {len(labels)} rows, too few to hold out "
            f"student.validation_fraction={holdout_fraction} of them; widen student.adapter_days"
        )
    scores = {}
    for prior_sd in prior_sds:
        candidate = make()
        fit_adapter(candidate, teacher_logit[kept], surface[kept], ids[kept], labels[kept], prior_sd)
        adapted = candidate.adapt(teacher_logit[held], surface[held], ids[held])
        scores[prior_sd] = float(
            F.binary_cross_entropy_with_logits(
                torch.from_numpy(adapted), torch.from_numpy(labels[held].astype(np.float32))
            )
        )
    chosen = min(scores, key=scores.__getitem__)
    adapter = make()
    fit = fit_adapter(adapter, teacher_logit, surface, ids, labels, chosen)
    return adapter, {**fit, "prior_sd": chosen, "holdout_log_loss": {str(k): v for k, v in scores.items()}}
