"""Absolute confidence thresholds: the slider scale, the histogram and exact counts."""
import math

import numpy as np

from engine.confidence import (SLIDER_MAX, SLIDER_MIN, SLIDER_STEPS, ConfidenceHistogram,
                               count_at_least, slider_from_threshold, threshold_from_slider)


def test_slider_scale_is_absolute_and_round_trips():
    assert threshold_from_slider(0) == -math.inf
    assert threshold_from_slider(1) > SLIDER_MIN and threshold_from_slider(SLIDER_STEPS) == SLIDER_MAX
    for t in (0.5, 1.0, 5.2, 88.7, 263.0):
        assert abs(threshold_from_slider(slider_from_threshold(t)) / t - 1) < 0.01
    assert slider_from_threshold(None) == slider_from_threshold(-math.inf) == slider_from_threshold(0) == 0
    # monotonic
    ts = [threshold_from_slider(p) for p in range(1, SLIDER_STEPS + 1)]
    assert all(a < b for a, b in zip(ts, ts[1:]))


def test_histogram_counts_match_exact_counts():
    rng = np.random.default_rng(0)
    conf = np.concatenate([1 + rng.exponential(10.0, 50_000), [0.01, 5000.0]])   # under + overflow
    h = ConfidenceHistogram(bins=80)
    for part in np.array_split(conf, 7):              # added frame by frame
        h.add(part)
    assert h.total == len(conf)
    for t in (-math.inf, 0.05, 1.0, 2.0, 5.2, 20.0, 88.7, 2000.0):
        exact = count_at_least(conf, t)
        assert abs(h.count_at_least(t) - exact) <= 0.02 * len(conf) + 2, t
    assert h.count_at_least(math.inf) == 0
    assert 1.0 <= h.quantile(0.5) <= 20.0
    h.reset()
    assert h.total == 0 and h.quantile(0.5) is None


def test_count_at_least_exact():
    c = np.array([1.0, 2.0, 3.0, np.nan])
    assert count_at_least(c, 2.0) == 2 and count_at_least(c, -math.inf) == 4


def test_sampled_frames_count_with_their_weight():
    rng = np.random.default_rng(1)
    conf = 1 + rng.exponential(10.0, 200_000)
    h = ConfidenceHistogram()
    for part in np.array_split(conf, 4):
        h.add(part, max_samples=4096)                  # ~12x fewer values looked at
    assert abs(h.total - len(conf)) <= 2
    for t in (2.0, 10.0, 50.0):
        assert abs(h.count_at_least(t) - count_at_least(conf, t)) <= 0.03 * len(conf)
