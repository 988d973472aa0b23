"""Engine results → compact display packets for the viewer (built off the GUI thread).

A `DisplayFrame` holds what the viewer draws for one result: the back-projected points
(subsampled, every valid depth pixel — the confidence threshold is applied later by the shader),
their colours, confidences and camera depths, the camera frustum and, for the newest frame only,
small preview images. Back-projection is `engine.geometry.backproject`; no geometry lives here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from engine.geometry import backproject, camera_frustum, image_at


FRUSTUM_FRACTION = 0.08     # drawn frustum depth, as a fraction of the scene's median depth


@dataclass
class DisplayFrame:
    index: int
    timestamp: float
    is_keyframe: bool
    segment: int
    c2w: np.ndarray                 # 4x4
    K: np.ndarray                   # 3x3 at the result resolution
    points: np.ndarray              # [M,3] float32 world (segment frame as emitted)
    colors: np.ndarray              # [M,3] uint8
    conf: np.ndarray                # [M] float32
    depth: np.ndarray               # [M] float32, depth of each point in its camera
    frustum: np.ndarray             # [5,3] float32: apex, then image corners TL, TR, BR, BL
    look_at: np.ndarray             # [3] a point the camera looks at (median depth on the axis)
    median_depth: float = 1.0
    width: int = 0                  # width of the result's depth map (or image)
    image: Optional[np.ndarray] = None      # h×w×3 uint8 preview (newest frame of a batch only)
    depth_map: Optional[np.ndarray] = None  # h×w float32 preview
    conf_map: Optional[np.ndarray] = None
    depth_rgb: Optional[np.ndarray] = None  # h×w×3 uint8 colours of depth_map (depth_colours), when made


_DEPTH_LUT: Optional[np.ndarray] = None


def depth_colours(depth_map: np.ndarray) -> Optional[np.ndarray]:
    """The preview colours of a depth map: turbo (near = blue) scaled to its 98th percentile,
    black where there is no depth; None when no pixel has depth. The worker makes them for the
    depth map a batch sends (off the GUI thread: a percentile and a lookup per pixel)."""
    global _DEPTH_LUT
    if _DEPTH_LUT is None:
        import pyqtgraph as pg
        try:
            cmap = pg.colormap.get("turbo")
        except Exception:  # older pyqtgraph without turbo
            cmap = pg.colormap.get("viridis")
        _DEPTH_LUT = np.asarray(cmap.getLookupTable(0.0, 1.0, 256, alpha=False), np.uint8)
    d = np.asarray(depth_map, np.float32)
    ok = np.isfinite(d) & (d > 0)
    if not ok.any():
        return None
    hi = float(np.percentile(d[ok], 98))
    idx = (np.clip(np.where(ok, d, 0.0) * (255.0 / max(hi, 1e-6)), 0, 255)).astype(np.uint8)
    rgb = _DEPTH_LUT[idx]
    rgb[~ok] = 0
    return rgb


def make_display_frame(r, stride: int = 2, frustum_depth: Optional[float] = None,
                       keep_images: bool = True) -> DisplayFrame:
    """Convert one FrameResult. `frustum_depth` fixes the drawn frustum size (scene units); None
    uses FRUSTUM_FRACTION of this frame's median depth."""
    c2w = np.asarray(r.c2w, np.float64)
    K = np.asarray(r.K, np.float64)
    image = np.asarray(r.image)
    if r.depth is not None:
        depth = np.asarray(r.depth, np.float32)
        pts, mask = backproject(depth, K, c2w, stride=stride, conf=None)
        colors = image_at(image, *depth.shape)[mask].astype(np.uint8)
        conf = (np.asarray(r.conf, np.float32)[mask] if r.conf is not None
                else np.ones(len(pts), np.float32))
        zs = depth[mask]
        h, w = depth.shape
    else:
        pts = np.zeros((0, 3), np.float32)
        colors = np.zeros((0, 3), np.uint8)
        conf = zs = np.zeros(0, np.float32)
        h, w = image.shape[:2]
    med = float(np.median(zs)) if len(zs) else 1.0
    fd = float(frustum_depth) if frustum_depth else FRUSTUM_FRACTION * med
    frustum, look_at = camera_frustum(K, c2w, w, h, near=fd, look_depth=med)
    return DisplayFrame(
        index=int(r.index), timestamp=float(r.timestamp), is_keyframe=bool(r.is_keyframe),
        segment=int(r.segment), c2w=c2w, K=K, points=pts, colors=colors, conf=conf,
        depth=np.asarray(zs, np.float32), frustum=frustum, look_at=np.asarray(look_at, np.float32),
        median_depth=med, width=int(w),
        image=image if keep_images else None,
        depth_map=(np.asarray(r.depth, np.float32) if keep_images and r.depth is not None else None),
        conf_map=(np.asarray(r.conf, np.float32) if keep_images and r.conf is not None else None),
    )
