"""Offline ranking metrics: AUC, normalized entropy (NE) and calibration.

NE is the log loss divided by the entropy of the base rate (He et al., 2014): 1.0 means no
better than predicting the average, lower is better. Calibration is mean prediction / mean label.
The AUC's 95% interval uses the Hanley-McNeil (1982) standard error, which needs only the AUC
and the class counts, so small samples say how little their AUC pins down.
"""

from __future__ import annotations

import math

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum statistic, ties averaged; NaN without both classes."""
    labels = np.asarray(labels, dtype=bool)
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = np.asarray(scores)[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    i = 0
    while i < len(sorted_scores):
        j = i
        while j + 1 < len(sorted_scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def normalized_entropy(labels: np.ndarray, probs: np.ndarray) -> float:
    base = float(np.mean(labels)) if len(labels) else math.nan
    if not 0.0 < base < 1.0:
        return math.nan
    entropy = -(base * math.log(base) + (1 - base) * math.log(1 - base))
    return log_loss(labels, probs) / entropy


def calibration(labels: np.ndarray, probs: np.ndarray) -> float:
    mean_label = float(np.mean(labels)) if len(labels) else math.nan
    return float(np.mean(probs)) / mean_label if mean_label > 0 else math.nan


def auc_interval(value: float, n_pos: int, n_neg: int, z: float = 1.96) -> tuple[float, float]:
    """Hanley-McNeil 95% interval of an AUC, clipped to [0, 1]; NaN without both classes."""
    if n_pos == 0 or n_neg == 0 or math.isnan(value):
        return math.nan, math.nan
    q1, q2 = value / (2 - value), 2 * value**2 / (1 + value)
    var = (value * (1 - value) + (n_pos - 1) * (q1 - value**2) + (n_neg - 1) * (q2 - value**2)) / (n_pos * n_neg)
    half = z * math.sqrt(max(var, 0.0))
    return max(0.0, value - half), min(1.0, value + half)


def binary_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    value = auc(labels, probs)
    n_pos = int(np.sum(labels))
    low, high = auc_interval(value, n_pos, len(labels) - n_pos)
    return {
        "auc": value,
        "auc_ci_low": low,
        "auc_ci_high": high,
        "log_loss": log_loss(labels, probs) if len(labels) else math.nan,
        "ne": normalized_entropy(labels, probs),
        "calibration": calibration(labels, probs),
        "rows": float(len(labels)),
        "positives": float(np.sum(labels)),
    }
