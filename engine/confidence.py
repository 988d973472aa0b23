"""Confidence thresholds in the engine's absolute units (no Qt).

The viewer, the exports and the CLI share one meaning of "minimum confidence": the number the
engine put in `FrameResult.conf` (the geometric engine's 1..~300, a neural depth head's 1 + exp).
It used to be a percentage of the range seen so far, which drifted as the range grew (30 % meant
5.2 at frame 91 and 88.7 at frame 161). Here:

- `threshold_from_slider` / `slider_from_threshold`: a fixed logarithmic slider scale over
  [SLIDER_MIN, SLIDER_MAX] (confidences are long-tailed); position 0 means "no threshold".
- `ConfidenceHistogram`: counts of every confidence seen, in fixed log-spaced bins, added in
  O(new points) as frames arrive; it draws the distribution beside the slider and estimates how
  many points a threshold keeps.
- `count_at_least`: the exact number of confidences >= a threshold (what is drawn / exported).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

SLIDER_STEPS = 1000          # slider positions 0..SLIDER_STEPS
SLIDER_MIN = 0.1             # threshold at position 1
SLIDER_MAX = 1000.0          # threshold at the last position
NO_THRESHOLD = float("-inf")


def threshold_from_slider(pos: int) -> float:
    """Absolute threshold of slider position `pos` (0 = show everything = -inf)."""
    pos = int(pos)
    if pos <= 0:
        return NO_THRESHOLD
    f = min(pos, SLIDER_STEPS) / SLIDER_STEPS
    return float(SLIDER_MIN * (SLIDER_MAX / SLIDER_MIN) ** f)


def slider_from_threshold(t: Optional[float]) -> int:
    """The nearest slider position of threshold `t` (None / -inf / <= 0 -> 0)."""
    if t is None or not math.isfinite(t) or t <= 0:
        return 0
    f = math.log(max(t, SLIDER_MIN) / SLIDER_MIN) / math.log(SLIDER_MAX / SLIDER_MIN)
    return max(1, min(SLIDER_STEPS, round(f * SLIDER_STEPS)))


def count_at_least(conf: np.ndarray, t: float) -> int:
    """Exact number of confidences >= t (all of them for t = -inf)."""
    conf = np.asarray(conf)
    if not math.isfinite(t) and t < 0:
        return int(conf.size)
    return int(np.count_nonzero(conf >= t))


class ConfidenceHistogram:
    """Log-spaced histogram of confidences over [SLIDER_MIN, SLIDER_MAX] with an under- and an
    overflow bin (bin 0 and bin -1), so every value is counted."""

    def __init__(self, bins: int = 60, lo: float = SLIDER_MIN, hi: float = SLIDER_MAX):
        self.edges = np.geomspace(lo, hi, bins + 1)
        self.counts = np.zeros(bins + 2, np.float64)    # float: sampled frames add weighted counts

    def reset(self) -> None:
        self.counts[:] = 0

    @property
    def total(self) -> int:
        return int(round(self.counts.sum()))

    def add(self, conf: Optional[np.ndarray], max_samples: Optional[int] = None) -> None:
        """Count `conf`; with `max_samples`, an evenly strided sample of it stands for all of it
        (weighted), so a dense frame costs O(max_samples) (the GUI thread adds every frame)."""
        if conf is None:
            return
        c = np.asarray(conf).ravel()
        n = c.size
        if max_samples and n > max_samples:
            c = c[:: -(-n // max_samples)]
        c = c.astype(np.float64, copy=False)
        finite = np.isfinite(c)
        c = c[finite]
        if c.size:
            idx = np.searchsorted(self.edges, c, side="right")     # 0 = below lo, bins+1 = >= hi
            weight = (n * finite.mean()) / c.size
            self.counts += weight * np.bincount(idx, minlength=len(self.counts))

    def count_at_least(self, t: float) -> int:
        """Estimated count >= t: whole bins above t plus the covered share of t's bin (log scale)."""
        if not math.isfinite(t):
            return self.total if t < 0 else 0
        i = int(np.searchsorted(self.edges, t, side="right"))
        above = float(self.counts[i + 1:].sum())
        if 1 <= i < len(self.edges):
            lo, hi = self.edges[i - 1], self.edges[i]
            above += self.counts[i] * math.log(hi / t) / math.log(hi / lo)
        elif i == 0:
            above += self.counts[0]
        return int(round(above))

    def quantile(self, q: float) -> Optional[float]:
        """Approximate confidence below which a fraction q of the values lie (bin upper edge)."""
        n = self.total
        if n == 0:
            return None
        k = int(np.searchsorted(np.cumsum(self.counts), q * n, side="left"))
        k = min(k, len(self.counts) - 1)
        return float(self.edges[min(k, len(self.edges) - 1)])
