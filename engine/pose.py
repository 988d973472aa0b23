"""Pose encoding <-> camera-to-world pose and intrinsics.

The LingBot-Map / VGGT camera heads predict 9 numbers `[t(3), q(4) = x, y, z, w, fov_h, fov_w]`.
Decoding (as upstream `pose_encoding_to_extri_intri`): R from the quaternion (normalised, scalar
last), `[R | t]`, `fx = (W/2) / tan(fov_w/2)`, `fy = (H/2) / tan(fov_h/2)`, principal point at the
image centre (W/2, H/2).

Direction: for LingBot-Map the decoded `[R | t]` is camera-to-world (shared/DESIGN.md
"Conventions"), so `decode_pose(..., convention="c2w")` returns it as the c2w matrix directly; for
VGGT it is world-to-camera (`convention="w2c"` inverts it).

Degenerate predictions (possible with untrained or random weights): a zero quaternion decodes to
the identity rotation, and a field of view outside (0, pi) is clamped to [1e-3, pi - 1e-3] rad
so that K stays finite (fov 0 would mean an infinite focal length).
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from .geometry import invert_se3

FOV_MIN, FOV_MAX = 1e-3, np.pi - 1e-3


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """[..., 4] (x, y, z, w) -> [..., 3, 3]; zero quaternions give the identity."""
    q = np.asarray(q, dtype=np.float64)
    flat = q.reshape(-1, 4).copy()
    bad = np.linalg.norm(flat, axis=1) < 1e-12
    flat[bad] = (0.0, 0.0, 0.0, 1.0)
    return Rotation.from_quat(flat).as_matrix().reshape(q.shape[:-1] + (3, 3))


def matrix_to_quat(R: np.ndarray) -> np.ndarray:
    """[..., 3, 3] -> [..., 4] (x, y, z, w) with w >= 0."""
    R = np.asarray(R, dtype=np.float64)
    q = Rotation.from_matrix(R.reshape(-1, 3, 3)).as_quat()
    q = np.where(q[:, 3:4] < 0, -q, q)
    return q.reshape(R.shape[:-2] + (4,))


def intrinsics_from_fov(fov_h, fov_w, height: int, width: int) -> np.ndarray:
    fh = np.clip(np.asarray(fov_h, dtype=np.float64), FOV_MIN, FOV_MAX)
    fw = np.clip(np.asarray(fov_w, dtype=np.float64), FOV_MIN, FOV_MAX)
    K = np.zeros(fh.shape + (3, 3))
    K[..., 0, 0] = (width / 2.0) / np.tan(fw / 2.0)
    K[..., 1, 1] = (height / 2.0) / np.tan(fh / 2.0)
    K[..., 0, 2] = width / 2.0
    K[..., 1, 2] = height / 2.0
    K[..., 2, 2] = 1.0
    return K


def decode_pose(pose_enc, image_hw: tuple[int, int], convention: str = "c2w") -> tuple[np.ndarray, np.ndarray]:
    """pose_enc [..., 9] -> (c2w [..., 4, 4] float64, K [..., 3, 3] float64) for an image of
    `image_hw` = (height, width). `convention` says what the decoded [R|t] is: "c2w" (LingBot-Map)
    or "w2c" (VGGT)."""
    p = np.asarray(pose_enc, dtype=np.float64)
    if p.shape[-1] != 9:
        raise ValueError(f"pose encoding must have 9 numbers, got shape {p.shape}")
    T = np.zeros(p.shape[:-1] + (4, 4))
    T[..., :3, :3] = quat_to_matrix(p[..., 3:7])
    T[..., :3, 3] = p[..., :3]
    T[..., 3, 3] = 1.0
    if convention == "w2c":
        T = invert_se3(T)
    elif convention != "c2w":
        raise ValueError(f"convention must be 'c2w' or 'w2c', got {convention!r}")
    return T, intrinsics_from_fov(p[..., 7], p[..., 8], *image_hw)


def encode_pose(c2w, K, image_hw: tuple[int, int], convention: str = "c2w") -> np.ndarray:
    """Inverse of `decode_pose` -> pose_enc [..., 9] float64."""
    T = np.asarray(c2w, dtype=np.float64)
    if convention == "w2c":
        T = invert_se3(T)
    K = np.asarray(K, dtype=np.float64)
    H, W = image_hw
    fov_h = 2.0 * np.arctan((H / 2.0) / K[..., 1, 1])
    fov_w = 2.0 * np.arctan((W / 2.0) / K[..., 0, 0])
    return np.concatenate([T[..., :3, 3], matrix_to_quat(T[..., :3, :3]), fov_h[..., None], fov_w[..., None]], axis=-1)
