import math

import numpy as np

from gem_model.train.metrics import auc, auc_interval, calibration, normalized_entropy


def test_auc_known_values():
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert auc(np.array([0, 0, 1, 1]), np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    # One inverted pair out of four: 3/4.
    assert auc(np.array([0, 1, 0, 1]), np.array([0.1, 0.3, 0.4, 0.9])) == 0.75
    # All tied scores: 0.5.
    assert auc(np.array([0, 1, 1, 0]), np.array([0.5, 0.5, 0.5, 0.5])) == 0.5
    assert math.isnan(auc(np.array([1, 1]), np.array([0.2, 0.3])))


def test_ne_is_one_for_the_base_rate_and_below_for_signal():
    labels = np.array([1, 0, 0, 0] * 25)
    assert abs(normalized_entropy(labels, np.full(100, 0.25)) - 1.0) < 1e-9
    assert normalized_entropy(labels, np.where(labels == 1, 0.9, 0.05)) < 0.5


def test_calibration_is_mean_prediction_over_mean_label():
    assert calibration(np.array([1, 0, 0, 0]), np.array([0.5, 0.5, 0.5, 0.5])) == 2.0


def test_auc_interval_matches_hanley_mcneil_by_hand():
    # A = 0.8, 50 positives, 50 negatives: Q1 = 0.8/1.2, Q2 = 1.28/1.8, SE = sqrt(4.951/2500) = 0.0445.
    low, high = auc_interval(0.8, 50, 50)
    assert abs((high - low) / 2 - 1.96 * 0.0445) < 2e-3
    assert all(math.isnan(x) for x in auc_interval(0.8, 0, 50))  # undefined without both classes
