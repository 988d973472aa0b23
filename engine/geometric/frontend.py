"""KLT feature tracks: corners detected at keyframes, followed frame to frame with pyramidal
Lucas-Kanade and a forward-backward check. Track ids are unique for the session and double as
map-point ids once a track is triangulated."""
from __future__ import annotations

import cv2
import numpy as np


class KLTFrontend:
    def __init__(self, width: int, height: int, max_features: int = 400, min_distance: float | None = None):
        self.width, self.height = width, height
        scale = max(width, height) / 640.0
        self.max_features = max_features
        self.min_distance = min_distance if min_distance is not None else max(6.0, 14.0 * scale)
        self.win = (21, 21) if scale > 0.6 else (15, 15)
        self.levels = 3
        self.fb_thresh = 1.0 * max(scale, 0.5)
        self.border = 4
        self.ids = np.zeros(0, np.int64)
        self.pts = np.zeros((0, 2), np.float32)
        self._prev_pyr = None
        self._next_id = 0
        self._criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 20, 0.03)

    def reset(self) -> None:
        self.ids = np.zeros(0, np.int64)
        self.pts = np.zeros((0, 2), np.float32)

    def track(self, gray: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Follow the live tracks into `gray`; returns (ids, points) of the survivors."""
        pyr = gray   # (the Python binding takes images, not prebuilt pyramids)
        prev, self._prev_pyr = self._prev_pyr, pyr
        if prev is None or len(self.ids) == 0:
            self.reset()
            return self.ids, self.pts
        p0 = self.pts.reshape(-1, 1, 2)
        p1, st, _ = cv2.calcOpticalFlowPyrLK(prev, pyr, p0, None, winSize=self.win, maxLevel=self.levels,
                                             criteria=self._criteria)
        if p1 is None:
            self.reset()
            return self.ids, self.pts
        p0b, stb, _ = cv2.calcOpticalFlowPyrLK(pyr, prev, p1, None, winSize=self.win, maxLevel=self.levels,
                                               criteria=self._criteria)
        p1 = p1.reshape(-1, 2)
        fb = np.linalg.norm(p0b.reshape(-1, 2) - self.pts, axis=1)
        b = self.border
        ok = (st.ravel() == 1) & (stb.ravel() == 1) & (fb < self.fb_thresh) \
            & (p1[:, 0] >= b) & (p1[:, 1] >= b) & (p1[:, 0] < self.width - b) & (p1[:, 1] < self.height - b)
        self.ids, self.pts = self.ids[ok], p1[ok].astype(np.float32)
        return self.ids, self.pts

    def detect(self, gray: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add corners away from the live tracks up to `max_features`; returns the new (ids, points)."""
        need = self.max_features - len(self.ids)
        if need < self.max_features // 10:
            return np.zeros(0, np.int64), np.zeros((0, 2), np.float32)
        mask = np.full(gray.shape, 255, np.uint8)
        b = self.border + 4
        mask[:b], mask[-b:], mask[:, :b], mask[:, -b:] = 0, 0, 0, 0
        r = int(round(self.min_distance))
        for x, y in self.pts:
            cv2.circle(mask, (int(x), int(y)), r, 0, -1)
        corners = cv2.goodFeaturesToTrack(gray, maxCorners=need, qualityLevel=0.01,
                                          minDistance=self.min_distance, mask=mask, blockSize=7)
        if corners is None or len(corners) == 0:
            return np.zeros(0, np.int64), np.zeros((0, 2), np.float32)
        corners = cv2.cornerSubPix(gray, corners.astype(np.float32), (5, 5), (-1, -1), self._criteria)
        pts = corners.reshape(-1, 2).astype(np.float32)
        ids = np.arange(self._next_id, self._next_id + len(pts), dtype=np.int64)
        self._next_id += len(pts)
        self.ids = np.concatenate([self.ids, ids])
        self.pts = np.concatenate([self.pts, pts])
        return ids, pts

    def add(self, ids, pts) -> None:
        """Track existing ids again from `pts` (map points matched again by the tracker)."""
        ids = np.asarray(ids, np.int64)
        if len(ids) == 0:
            return
        keep = ~np.isin(self.ids, ids)
        self.ids = np.concatenate([self.ids[keep], ids])
        self.pts = np.concatenate([self.pts[keep], np.asarray(pts, np.float32).reshape(-1, 2)])

    def remove(self, drop_ids) -> None:
        if len(drop_ids) == 0 or len(self.ids) == 0:
            return
        keep = ~np.isin(self.ids, np.asarray(drop_ids))
        self.ids, self.pts = self.ids[keep], self.pts[keep]
