"""Which exported points a frame sees: the co-visibility test behind the COLMAP export's tracks.

A point exported from one frame (its "host") is observed in another frame when it projects into
that frame's image, in front of the camera, and agrees with what the frame saw there:

- the image is divided into square cells (`cell_size`: about CELLS_ACROSS cells across), and per
  cell the nearest depth is known from two sources: the frame's own depth map (when it has one)
  and the host's points projected into it (a z-buffer of the batch, so a host point hidden behind
  another host point is not observed);
- a point is visible when its depth is within DEPTH_TOLERANCE (relative) of the nearest depth of
  its cell, and, where the frame has its own depth in that cell, not in front of it by more than
  the tolerance either (a point floating in the frame's free space is not what it saw).

Frames without depth (e.g. the geometric engine's non-keyframes) are judged by the host batch's
z-buffer alone: occlusion by geometry of other frames is not known there.

Everything works on one frame's arrays (`View`: pose, intrinsics and a per-cell depth map of a
few KB), so an exporter can keep a window of views in memory, never the depth maps themselves.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from ..geometry import affine_rows

DEPTH_TOLERANCE = 0.05
CELLS_ACROSS = 96
MIN_CELL_PX = 3


def cell_size(width: int, stride: int = 1) -> int:
    """Cell side in pixels for an image `width` wide: about CELLS_ACROSS cells across, and never
    finer than the export's pixel stride (a finer cell would hold one point each, seeing no occluder)."""
    return max(MIN_CELL_PX, int(stride), int(round(width / CELLS_ACROSS)))


def cell_min_depth(depth: np.ndarray, cell: int) -> np.ndarray:
    """The nearest valid depth per cell of a depth map (inf where a cell holds none)."""
    d = np.asarray(depth, np.float32)
    h, w = d.shape
    ch, cw = -(-h // cell), -(-w // cell)
    pad = np.full((ch * cell, cw * cell), np.inf, np.float32)
    valid = np.isfinite(d) & (d > 0)
    pad[:h, :w] = np.where(valid, d, np.inf)
    return pad.reshape(ch, cell, cw, cell).min(axis=(1, 3))


@dataclasses.dataclass
class View:
    """What the test needs of one frame: world-to-camera pose, K and size of its depth grid
    (the image when it has no depth), the cell size and its own per-cell nearest depth (None
    without depth), and how to turn grid pixels into image pixels (`image_hw`)."""
    w2c: np.ndarray
    K: np.ndarray
    hw: tuple
    image_hw: tuple
    cell: int
    cells: Optional[np.ndarray]

    @classmethod
    def of(cls, c2w, K, depth, image_hw, stride: int = 1) -> "View":
        from ..geometry import invert_se3

        hw = tuple(int(x) for x in (np.shape(depth) if depth is not None else image_hw))
        cell = cell_size(hw[1], stride)
        cells = cell_min_depth(depth, cell) if depth is not None else None
        return cls(w2c=invert_se3(np.asarray(c2w, np.float64)), K=np.asarray(K, np.float64), hw=hw,
                   image_hw=tuple(int(x) for x in image_hw), cell=cell, cells=cells)


def visible(points: np.ndarray, view: View, tol: float = DEPTH_TOLERANCE) -> tuple[np.ndarray, np.ndarray]:
    """Which of `points` [M,3] (world) `view` sees: (indices into points, uv [k,2] in OpenCV
    pixel coordinates of the view's image)."""
    X = np.asarray(points, np.float64).reshape(-1, 3)
    cam = affine_rows(X, view.w2c[:3, :3], view.w2c[:3, 3])
    z = cam[:, 2]
    front = z > 1e-9
    idx = np.nonzero(front)[0]
    cam, z = cam[idx], z[idx]
    u = view.K[0, 0] * cam[:, 0] / z + view.K[0, 1] * cam[:, 1] / z + view.K[0, 2]
    v = view.K[1, 1] * cam[:, 1] / z + view.K[1, 2]
    h, w = view.hw
    inside = (u >= -0.5) & (u < w - 0.5) & (v >= -0.5) & (v < h - 0.5)
    idx, u, v, z = idx[inside], u[inside], v[inside], z[inside]
    if not len(idx):
        return idx, np.zeros((0, 2))
    c = view.cell
    ch, cw = -(-h // c), -(-w // c)
    flat = (np.clip(((v + 0.5) // c).astype(np.int64), 0, ch - 1) * cw
            + np.clip(((u + 0.5) // c).astype(np.int64), 0, cw - 1))
    nearest = np.full(ch * cw, np.inf)
    np.minimum.at(nearest, flat, z)                     # the batch's own z-buffer
    own = None
    if view.cells is not None:
        own = view.cells.reshape(-1).astype(np.float64)[flat]
        nearest = np.minimum(nearest[flat], own)
    else:
        nearest = nearest[flat]
    ok = z <= nearest * (1.0 + tol)
    if own is not None:
        ok &= ~(z < own * (1.0 - tol))                  # inf where the frame saw nothing: no veto
    idx, u, v = idx[ok], u[ok], v[ok]
    ih, iw = view.image_hw
    # pixel centres map between the grid and the image as (u + 0.5) * s - 0.5
    uv = np.stack([(u + 0.5) * iw / w - 0.5, (v + 0.5) * ih / h - 0.5], axis=1)
    return idx, uv
