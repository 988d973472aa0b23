"""Geometry shared by the store, the exporters and the viewer: depth back-projection, point
collection over results, and applying re-alignment similarities to segments.

Conventions (DESIGN.md): poses are camera-to-world 4x4, OpenCV camera axes (x right, y down,
z forward); pixel (u, v) integer coordinates are pixel centres, as in OpenCV's K.

Re-alignment: an EngineEvent("realign", segment, transform) gives the 4x4 similarity that maps
the segment's results as emitted to world. A later event for the same segment replaces the
earlier one (engines send absolute transforms, so replaying the event log is idempotent).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

import numpy as np


def pixel_rays(h: int, w: int, K: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Camera-frame rays (x/z, y/z) of the pixel centres of a strided grid: (rx, ry, (vs, us))."""
    K = np.asarray(K, dtype=np.float64)
    us = np.arange(0, w, stride)
    vs = np.arange(0, h, stride)
    rx = (us - K[0, 2]) / K[0, 0] - (K[0, 1] / K[0, 0]) * ((vs[:, None] - K[1, 2]) / K[1, 1])
    ry = np.broadcast_to((vs[:, None] - K[1, 2]) / K[1, 1], rx.shape)
    return rx, ry, (vs, us)


def backproject(depth: np.ndarray, K: np.ndarray, c2w: np.ndarray, stride: int = 1,
                conf: Optional[np.ndarray] = None, conf_threshold: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """World points of the valid pixels of a depth map.

    Valid = finite depth > 0, on the stride grid (every `stride`-th row and column), and
    conf >= conf_threshold when `conf` is given. Returns (points [M,3] float32, mask [h,w] bool),
    points in row-major order of the mask, so `image[mask]` gives their colours.
    """
    depth = np.asarray(depth)
    if depth.ndim != 2:
        raise ValueError(f"depth must be h x w, got shape {depth.shape}")
    stride = max(1, int(stride))
    h, w = depth.shape
    rx, ry, (vs, us) = pixel_rays(h, w, K, stride)
    d = depth[::stride, ::stride].astype(np.float64)
    valid = np.isfinite(d) & (d > 0)
    if conf is not None:
        c = np.asarray(conf)[::stride, ::stride]
        valid &= c >= conf_threshold
    z = d[valid]
    cam = np.stack([rx[valid] * z, ry[valid] * z, z], axis=1)
    c2w = np.asarray(c2w, dtype=np.float64)
    pts = cam @ c2w[:3, :3].T + c2w[:3, 3]
    mask = np.zeros((h, w), dtype=bool)
    mask[np.ix_(vs, us)] = valid
    return pts.astype(np.float32), mask


def image_at(image: np.ndarray, h: int, w: int) -> np.ndarray:
    """The colour image at depth resolution (nearest neighbour if the sizes differ)."""
    if image.shape[:2] == (h, w):
        return image
    ys = np.minimum((np.arange(h) + 0.5) * image.shape[0] / h, image.shape[0] - 1).astype(int)
    xs = np.minimum((np.arange(w) + 0.5) * image.shape[1] / w, image.shape[1] - 1).astype(int)
    return image[ys[:, None], xs[None, :]]


def camera_frustum(K: np.ndarray, c2w: np.ndarray, w: int, h: int, near: float,
                   look_depth: float) -> tuple[np.ndarray, np.ndarray]:
    """World points of a camera's frustum for drawing: [5,3] float32 (apex, then the image corners
    TL, TR, BR, BL on the plane z = `near`), and the point on the optical axis at `look_depth`."""
    uv1 = np.array([[0, 0, 1], [w - 1, 0, 1], [w - 1, h - 1, 1], [0, h - 1, 1], [(w - 1) / 2, (h - 1) / 2, 1]],
                   np.float64)
    cam = np.linalg.solve(np.asarray(K, np.float64), uv1.T).T * np.array([[near]] * 4 + [[look_depth]])
    c2w = np.asarray(c2w, np.float64)
    world = cam @ c2w[:3, :3].T + c2w[:3, 3]
    return np.concatenate([c2w[None, :3, 3], world[:4]]).astype(np.float32), world[4]


def frame_points(r, conf_threshold: float = 0.0, stride: int = 1):
    """(points [M,3] f32, colors [M,3] u8, conf [M] f32) of one FrameResult. A result without a
    confidence map is not filtered by the threshold; its points get confidence 1."""
    if r.depth is None:
        return (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8), np.zeros(0, np.float32))
    h, w = r.depth.shape
    pts, mask = backproject(r.depth, r.K, r.c2w, stride, r.conf, conf_threshold if r.conf is not None else -np.inf)
    colors = image_at(np.asarray(r.image), h, w)[mask].astype(np.uint8)
    conf = (np.asarray(r.conf, dtype=np.float32)[mask] if r.conf is not None
            else np.ones(len(pts), np.float32))
    return pts, colors, conf


def collect_points(results: Iterable, conf_threshold: float = 0.0, stride: int = 1):
    """Concatenated (points [M,3] float32, colors [M,3] uint8, conf [M] float32) of all results."""
    parts = [frame_points(r, conf_threshold, stride) for r in results]
    if not parts:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8), np.zeros(0, np.float32)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


# --- re-alignment -----------------------------------------------------------------------------

def split_similarity(T: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Decompose a 4x4 similarity [sR t; 0 1] into (s, R, t)."""
    T = np.asarray(T, dtype=np.float64)
    A = T[:3, :3]
    s = float(np.cbrt(np.linalg.det(A)))
    if not np.isfinite(s) or s <= 0:
        raise ValueError("re-alignment transform is not a proper similarity (det <= 0)")
    return s, A / s, T[:3, 3].copy()


def segment_transforms(events: Iterable) -> dict[int, np.ndarray]:
    """segment -> 4x4 similarity from the whole-segment "realign" events (the last one per segment
    wins). Events limited to a frame range (`frames`) are not included: see `result_transforms`."""
    out: dict[int, np.ndarray] = {}
    for e in events:
        if getattr(e, "kind", None) == "realign" and e.transform is not None \
                and getattr(e, "frames", None) is None:
            out[int(e.segment)] = np.asarray(e.transform, dtype=np.float64).reshape(4, 4)
    return out


def result_transforms(keys: Sequence[tuple[int, int]], events: Iterable) -> list:
    """For results given as (segment, index) pairs: the 4x4 similarity each one is placed by (None
    = none), replaying the "realign" events in order — a later event replaces an earlier one on
    the results it covers (its whole segment, or its `frames=(first, last)` range)."""
    keys = list(keys)
    out: list = [None] * len(keys)
    by_seg: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for seg in {k[0] for k in keys}:
        pos = np.array([p for p, k in enumerate(keys) if k[0] == seg], dtype=np.int64)
        idx = np.array([keys[p][1] for p in pos], dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        by_seg[seg] = (idx[order], pos[order])
    mats: list = []
    which = np.full(len(keys), -1, dtype=np.int64)
    for e in events:
        if getattr(e, "kind", None) != "realign" or e.transform is None or int(e.segment) not in by_seg:
            continue
        idx, pos = by_seg[int(e.segment)]
        frames = getattr(e, "frames", None)
        if frames is None:
            sel = pos
        else:
            first, last = int(frames[0]), int(frames[1])
            sel = pos[np.searchsorted(idx, first, "left"):np.searchsorted(idx, last, "right")]
        if len(sel):
            mats.append(np.asarray(e.transform, dtype=np.float64).reshape(4, 4))
            which[sel] = len(mats) - 1
    for p in np.flatnonzero(which >= 0):
        out[p] = mats[which[p]]
    return out


def apply_similarity(r, T: np.ndarray):
    """A copy of FrameResult `r` moved by the similarity T: c2w stays rigid (rotation R_T R,
    camera centre mapped by T) and the depth is multiplied by the scale, so back-projecting the
    new result gives exactly T applied to the old points."""
    s, R, t = split_similarity(T)
    c2w = np.eye(4)
    c2w[:3, :3] = R @ np.asarray(r.c2w, dtype=np.float64)[:3, :3]
    c2w[:3, 3] = s * (R @ np.asarray(r.c2w, dtype=np.float64)[:3, 3]) + t
    depth = None if r.depth is None else (np.asarray(r.depth, dtype=np.float32) * np.float32(s))
    return dataclasses.replace(r, c2w=c2w, depth=depth)


def apply_realignments(results: Sequence, events: Iterable) -> list:
    """Results with their latest re-alignment applied (whole segment or frame range; results no
    event covers are returned unchanged)."""
    results = list(results)
    events = [e for e in events if getattr(e, "kind", None) == "realign"]
    if not events:
        return results
    Ts = result_transforms([(int(r.segment), int(r.index)) for r in results], events)
    return [r if T is None else apply_similarity(r, T) for r, T in zip(results, Ts)]
