"""Offline ranking metrics: AUC, normalized entropy (NE) and calibration.

NE is the log loss divided by the entropy of the base rate (He et al., 2014): 1.0 means no
better than predicting the average, lower is better. Calibration is mean prediction / mean label.
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
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
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


def binary_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    return {
        "auc": auc(labels, probs),
        "ne": normalized_entropy(labels, probs),
        "calibration": calibration(labels, probs),
        "rows": float(len(labels)),
        "positives": float(np.sum(labels)),
    }
