"""Camera geometry of the engine, defined once: the pixel-centre convention, pixels <-> rays and
depth back-projection, intrinsics rescaling, the SO(3) / SE(3) / Sim(3) operations, and moving
results by the re-alignment similarities. Every module uses these (engine/align fits similarities
with them; engine/pose.py encodes poses; the store, the exporters, the viewer and the engines).

Conventions (DESIGN.md "Conventions"):
- Poses are camera-to-world 4x4, OpenCV camera axes (x right, y down, z forward).
- **Pixel centres are at integer coordinates** (OpenCV's K): pixel (u, v) looks along
  K⁻¹ (u, v, 1); the image spans [-0.5, w - 0.5]. Where another convention meets ours, the
  conversion is made at that border and nowhere else:
  - COLMAP puts the first pixel's centre at (0.5, 0.5): engine/io/colmap.py adds 0.5 to the
    principal point and to every 2-D observation it writes;
  - resizing an image by s maps a pixel centre u to (u + 0.5)·s − 0.5 (`scale_intrinsics`;
    engine.intrinsics.Intrinsics.scaled_to uses it);
  - the neural heads' decoded intrinsics put the principal point at (W/2, H/2) (engine/pose.py,
    as upstream decodes them, whose own unprojection also uses integer pixel coordinates): that
    K is used as given, with no half-pixel shift, so our points match upstream's.
- A similarity maps x → s·R·x + t; as a 4x4 matrix it is [[s·R, t], [0, 1]]. Moving a camera
  pose by a similarity keeps it rigid (rotation R·R_c, centre mapped by the similarity) and
  multiplies its depth by s, so back-projecting the moved camera gives exactly the similarity
  applied to the old points.

Re-alignment: an EngineEvent("realign", segment, transform) gives the 4x4 similarity that maps
the segment's results as emitted to world. A later event for the same segment replaces the
earlier one (engines send absolute transforms, so replaying the event log is idempotent).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Sequence

import numpy as np


# --- rotations, rigid transforms and similarities ---------------------------------------------

def sim3_matrix(s: float, R: np.ndarray, t: np.ndarray) -> np.ndarray:
    """4×4 [[s·R, t], [0, 1]]."""
    T = np.eye(4)
    T[:3, :3] = float(s) * np.asarray(R, np.float64)
    T[:3, 3] = np.asarray(t, np.float64).ravel()
    return T


def sim3_split(T: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(s, R, t) of a 4×4 similarity; raises ValueError for a reflection or a singular matrix."""
    T = np.asarray(T, np.float64)
    s = float(np.cbrt(np.linalg.det(T[:3, :3])))
    if not np.isfinite(s) or s <= 0:
        raise ValueError("not a proper similarity (det <= 0)")
    return s, T[:3, :3] / s, T[:3, 3].copy()


def sim3_inverse(T: np.ndarray) -> np.ndarray:
    """Inverse of a similarity (4×4) or of a stack of them (…×4×4; a proper similarity assumed,
    s² read from the rows of s·R, as the pose graph's residuals use it)."""
    T = np.asarray(T, np.float64)
    if T.ndim > 2:
        A = T[..., :3, :3]
        s2 = np.einsum("...ij,...ij->...", A, A) / 3.0          # s² (rows of s·R have norm s)
        Ainv = np.swapaxes(A, -1, -2) / s2[..., None, None]
        out = np.zeros_like(T)
        out[..., :3, :3] = Ainv
        out[..., :3, 3] = -np.einsum("...ij,...j->...i", Ainv, T[..., :3, 3])
        out[..., 3, 3] = 1.0
        return out
    s, R, t = sim3_split(T)
    return sim3_matrix(1.0 / s, R.T, -(R.T @ t) / s)


def invert_se3(T: np.ndarray) -> np.ndarray:
    """Inverse of rigid transforms (…×4×4): [Rᵀ, −Rᵀt]. (A similarity: `sim3_inverse`.)"""
    T = np.asarray(T, dtype=np.float64)
    out = np.zeros_like(T)
    Rt = np.swapaxes(T[..., :3, :3], -1, -2)
    out[..., :3, :3] = Rt
    out[..., :3, 3] = -np.einsum("...ij,...j->...i", Rt, T[..., :3, 3])
    out[..., 3, 3] = 1.0
    return out


def so3_exp(w: np.ndarray) -> np.ndarray:
    """Rotation vectors (…×3) → rotation matrices (…×3×3), stable near zero."""
    w = np.asarray(w, np.float64)
    th = np.linalg.norm(w, axis=-1)[..., None, None]
    small = th < 1e-8
    ths = np.where(small, 1.0, th)
    a = np.where(small, 1.0 - th ** 2 / 6.0, np.sin(ths) / ths)
    b = np.where(small, 0.5 - th ** 2 / 24.0, (1.0 - np.cos(ths)) / ths ** 2)
    z = np.zeros(w.shape[:-1])
    W = np.stack([np.stack([z, -w[..., 2], w[..., 1]], -1),
                  np.stack([w[..., 2], z, -w[..., 0]], -1),
                  np.stack([-w[..., 1], w[..., 0], z], -1)], -2)
    return np.eye(3) + a * W + b * (W @ W)


def so3_log(R: np.ndarray) -> np.ndarray:
    """Rotation matrices (…×3×3) → rotation vectors (…×3); handles angles near 0 and π."""
    R = np.asarray(R, np.float64)
    c = np.clip((np.trace(R, axis1=-2, axis2=-1) - 1.0) / 2.0, -1.0, 1.0)
    th = np.arccos(c)
    v = np.stack([R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]], -1)
    sin = np.sin(th)
    small = sin < 1e-6
    k = np.where(small, 0.5 + th ** 2 / 12.0, th / (2.0 * np.where(small, 1.0, sin)))
    out = v * k[..., None]
    near_pi = small & (th > 1.0)
    if np.any(near_pi):   # axis from the symmetric part: R + I = 2 n nᵀ at θ = π
        Rp = R[near_pi]
        B = (Rp + np.eye(3)) / 2.0
        j = np.argmax(np.einsum("nii->ni", B), axis=1)
        n = B[np.arange(len(Rp)), :, j] / np.sqrt(np.maximum(B[np.arange(len(Rp)), j, j], 1e-12))[:, None]
        out[near_pi] = n * th[near_pi][:, None]
    return out


def sim3_exp(x: np.ndarray) -> np.ndarray:
    """The optimisation chart: x = (ω[3], u[3], σ) (…×7) → 4×4 [[e^σ·exp(ω), u], [0, 1]].
    (Not the group exponential — a simple, global-enough chart; identity at 0.)"""
    x = np.asarray(x, np.float64)
    T = np.zeros(x.shape[:-1] + (4, 4))
    T[..., :3, :3] = np.exp(x[..., 6])[..., None, None] * so3_exp(x[..., :3])
    T[..., :3, 3] = x[..., 3:6]
    T[..., 3, 3] = 1.0
    return T


def sim3_log(T: np.ndarray) -> np.ndarray:
    """Inverse of `sim3_exp` (…×4×4 → …×7)."""
    T = np.asarray(T, np.float64)
    s = np.cbrt(np.linalg.det(T[..., :3, :3]))
    R = T[..., :3, :3] / s[..., None, None]
    return np.concatenate([so3_log(R), T[..., :3, 3], np.log(s)[..., None]], -1)


# --- moving poses, points and depth by a similarity -------------------------------------------

def apply_to_c2w(S: np.ndarray, c2w: np.ndarray) -> np.ndarray:
    """Camera-to-world pose(s) (4×4 or N×4×4) moved by the similarity S: still rigid, rotation
    R_S·R, centre mapped by S. Pair it with `apply_to_depth(depth, s)`."""
    s, R, t = sim3_split(S)
    P = np.array(c2w, np.float64, copy=True)
    P[..., :3, :3] = R @ P[..., :3, :3]
    P[..., :3, 3] = s * (P[..., :3, 3] @ R.T) + t
    return P


def affine_rows(X: np.ndarray, M: np.ndarray, t: Optional[np.ndarray] = None) -> np.ndarray:
    """X @ M.T + t in float64 for many rows X [N,k] and a small M [m,k]: column by column,
    without BLAS. OpenBLAS's gemm on an N×3 by 3×3 product is an order of magnitude slower than
    these elementwise passes (and its threads thrash a loaded machine); the results agree to
    rounding (benchmarks/edits_bench.py measures an export's crop, which runs this per frame)."""
    X = np.asarray(X, np.float64)
    M = np.asarray(M, np.float64)
    n, k = X.shape
    out = np.empty((n, M.shape[0]), np.float64)
    for i in range(M.shape[0]):
        c = out[:, i]
        np.multiply(X[:, 0], M[i, 0], out=c)
        for j in range(1, k):
            c += X[:, j] * M[i, j]
        if t is not None:
            c += t[i]
    return out


def apply_to_points(S: np.ndarray, X: np.ndarray) -> np.ndarray:
    """N×3 points mapped by the similarity S."""
    S = np.asarray(S, np.float64)
    return affine_rows(np.asarray(X).reshape(-1, 3), S[:3, :3], S[:3, 3])


def apply_to_depth(depth: Optional[np.ndarray], s: float) -> Optional[np.ndarray]:
    """A depth map of a camera moved by a similarity of scale s (0 = no depth stays 0)."""
    if depth is None:
        return None
    return (np.asarray(depth, np.float32) * np.float32(s)).astype(np.float32)


def correction(old_pose: np.ndarray, new_pose: np.ndarray) -> np.ndarray:
    """The world similarity C with new_pose = C · old_pose (both 4×4 similarities, e.g. a
    keyframe's pose before and after a pose-graph optimisation): apply C to everything that
    keyframe anchors (its depth, its points, the frames tracked from it)."""
    return np.asarray(new_pose, np.float64) @ sim3_inverse(old_pose)


# --- intrinsics -------------------------------------------------------------------------------

def scale_intrinsics(K: np.ndarray, src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> np.ndarray:
    """Intrinsics for an image resized from src_hw to dst_hw (h, w): focal lengths and skew scale,
    a pixel centre u moves to (u + 0.5)·s − 0.5 (integer pixel centres)."""
    sy, sx = dst_hw[0] / src_hw[0], dst_hw[1] / src_hw[1]
    K = np.asarray(K, dtype=np.float64).copy()
    K[0, 0] *= sx
    K[0, 1] *= sx
    K[1, 1] *= sy
    K[0, 2] = (K[0, 2] + 0.5) * sx - 0.5
    K[1, 2] = (K[1, 2] + 0.5) * sy - 0.5
    return K


# --- pixels, rays and depth -------------------------------------------------------------------

def rays_at(u, v, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Camera-frame rays (x/z, y/z) of pixels (u, v) (arrays that broadcast; integer = centre)."""
    K = np.asarray(K, dtype=np.float64)
    ry = (v - K[1, 2]) / K[1, 1]
    rx = (u - K[0, 2]) / K[0, 0] - (K[0, 1] / K[0, 0]) * ry
    return rx, ry


def pixel_rays(h: int, w: int, K: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Camera-frame rays (x/z, y/z) of the pixel centres of a strided grid: (rx, ry, (vs, us))."""
    us = np.arange(0, w, stride)
    vs = np.arange(0, h, stride)
    rx, ry = rays_at(us, vs[:, None], K)
    return rx, np.broadcast_to(ry, rx.shape), (vs, us)


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
    pts = apply_to_points(c2w, cam)
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
    world = apply_to_points(c2w, cam)
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
    """A copy of FrameResult `r` moved by the similarity T (`apply_to_c2w`, `apply_to_depth`):
    back-projecting the new result gives exactly T applied to the old points."""
    return dataclasses.replace(r, c2w=apply_to_c2w(T, r.c2w), depth=apply_to_depth(r.depth, sim3_split(T)[0]))


def apply_realignments(results: Sequence, events: Iterable) -> list:
    """Results with their latest re-alignment applied (whole segment or frame range; results no
    event covers are returned unchanged)."""
    results = list(results)
    events = [e for e in events if getattr(e, "kind", None) == "realign"]
    if not events:
        return results
    Ts = result_transforms([(int(r.segment), int(r.index)) for r in results], events)
    return [r if T is None else apply_similarity(r, T) for r, T in zip(results, Ts)]
