"""MP4 video of a session: the point cloud rendered along the camera path (every exported
frame's pose and intrinsics, in order) or on an orbit around the scene.

The engine owns the geometry and the file: which cameras (the path, or `orbit_poses`), each
camera as one GL clip matrix (`clip_matrix`: the OpenCV pinhole K and camera-to-world pose, so a
video frame of the camera path lines up with the session's image of that frame), the frame
writer (OpenCV's VideoWriter, MPEG-4 part 2 `mp4v`: in every OpenCV wheel) and the progress bar.
The drawing is the caller's `renderer` (the engine never imports vispy or Qt):
ui/video_render.py's `OffscreenRenderer` draws with vispy offscreen, in the GUI's GL context or
through EGL (Mesa's llvmpipe, no GPU or display needed).

Sizes: the session's intrinsics are scaled to the video's height and the image centred, so
another aspect ratio shows more (or less) of the scene at the sides, never a stretched one.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Sequence, Union

import numpy as np

from .atomic import TMP_SUFFIX, OutputError

PathLike = Union[str, Path]

DEFAULT_SIZE = (1280, 720)
DEFAULT_FPS = 30.0
ORBIT_SECONDS = 8.0            # an orbit's length at the chosen frame rate
ORBIT_FOV_DEG = 60.0
ORBIT_ELEVATION_DEG = 25.0
MAX_POINTS = 2_000_000         # rendered at most (thinned evenly beyond)


def parse_size(text: str) -> tuple[int, int]:
    """"WxH" -> (W, H); ValueError with the reason for anything else."""
    try:
        w, h = (int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"video size must be WIDTHxHEIGHT, e.g. 1280x720, got {text!r}") from None
    if not (16 <= w <= 8192 and 16 <= h <= 8192):
        raise ValueError(f"video size must be between 16x16 and 8192x8192, got {text!r}")
    # the mp4v encoder wants even sizes
    return w + (w % 2), h + (h % 2)


def fit_intrinsics(K: np.ndarray, src_hw: tuple, dst_wh: tuple) -> np.ndarray:
    """K of an image `src_hw` for a video frame `dst_wh`: scaled to the height, centred."""
    h, w = src_hw
    W, H = dst_wh
    s = H / h
    K2 = np.asarray(K, np.float64).copy()
    K2[0, 0] *= s
    K2[1, 1] *= s
    K2[0, 1] *= s
    K2[0, 2] = (K[0, 2] + 0.5) * s - 0.5 + (W - w * s) / 2
    K2[1, 2] = (K[1, 2] + 0.5) * s - 0.5
    return K2


def clip_matrix(c2w: np.ndarray, K: np.ndarray, W: int, H: int, near: float, far: float) -> np.ndarray:
    """World -> GL clip coordinates (column-vector 4x4) of an OpenCV camera: NDC x right, y up,
    pixel centres at (u + 0.5) / W, depth in [near, far] -> [-1, 1]."""
    from ..geometry import invert_se3

    P = np.zeros((4, 4))
    P[0, 0] = 2 * K[0, 0] / W
    P[0, 1] = 2 * K[0, 1] / W
    P[0, 2] = 2 * (K[0, 2] + 0.5) / W - 1
    P[1, 1] = -2 * K[1, 1] / H
    P[1, 2] = 1 - 2 * (K[1, 2] + 0.5) / H
    P[2, 2] = (far + near) / (far - near)
    P[2, 3] = -2 * far * near / (far - near)
    P[3, 2] = 1.0
    return P @ invert_se3(np.asarray(c2w, np.float64))


def orbit_poses(points: np.ndarray, centres: np.ndarray, up: np.ndarray, n: int) -> list:
    """`n` camera-to-world poses (OpenCV axes) on a circle around the cloud, looking at its
    centre, `up` the scene's up direction, one turn."""
    pts = np.asarray(points, np.float64).reshape(-1, 3)
    ref = pts if len(pts) else np.asarray(centres, np.float64).reshape(-1, 3)
    lo, hi = np.percentile(ref, 2, axis=0), np.percentile(ref, 98, axis=0)
    target = (lo + hi) / 2
    radius = max(float(np.linalg.norm(hi - lo)), 1e-6) * 0.9
    up = np.asarray(up, np.float64)
    up /= np.linalg.norm(up) or 1.0
    a = np.cross(up, [1.0, 0, 0] if abs(up[0]) < 0.9 else [0, 0, 1.0])
    a /= np.linalg.norm(a)
    b = np.cross(up, a)
    el = math.radians(ORBIT_ELEVATION_DEG)
    poses = []
    for i in range(n):
        t = 2 * math.pi * i / n
        eye = target + radius * (math.cos(el) * (math.cos(t) * a + math.sin(t) * b) + math.sin(el) * up)
        z = target - eye
        z /= np.linalg.norm(z)
        x = np.cross(-up, z)           # OpenCV: y down = -up, x = y cross z
        x /= np.linalg.norm(x)
        y = np.cross(z, x)
        c2w = np.eye(4)
        c2w[:3, :3] = np.column_stack([x, y, z])
        c2w[:3, 3] = eye
        poses.append(c2w)
    return poses


def render_video(path: PathLike, points: np.ndarray, colors: np.ndarray, cameras: Sequence,
                 renderer: Callable, size: tuple = DEFAULT_SIZE, fps: float = DEFAULT_FPS,
                 orbit: bool = False, progress: bool = False) -> dict:
    """Render the cloud (`points` [M,3], `colors` [M,3] uint8) to an MP4 at `path`. `cameras`:
    the camera path, (c2w 4x4, K 3x3, width, height) per exported frame in order; the video has
    one frame per camera, or, with `orbit`, ORBIT_SECONDS of a turn around the scene.
    `renderer(points, colors, centres, (W, H))` returns an object whose `render(clip)` gives an
    H x W x 3 uint8 RGB frame for a clip matrix (`clip_matrix`) and whose `close()` frees it.
    Returns {"frames", "size", "fps", "file"}."""
    import cv2
    from tqdm import tqdm

    W, H = (int(x) for x in size)
    if W % 2 or H % 2 or W < 16 or H < 16:
        raise OutputError(f"video size must be even and at least 16x16, got {W}x{H}")
    if not fps or fps <= 0:
        raise OutputError(f"video frame rate must be positive, got {fps}")
    if not len(cameras):
        raise OutputError("video export: no camera to render from")
    pts = np.asarray(points, np.float32).reshape(-1, 3)
    cols = np.asarray(colors, np.uint8).reshape(-1, 3)
    centres = np.array([np.asarray(c[0], np.float64)[:3, 3] for c in cameras])
    ref = pts if len(pts) else centres
    extent = float(np.linalg.norm(np.ptp(ref, axis=0))) if len(ref) > 1 else 1.0
    extent = extent or 1.0
    if orbit:
        up = -np.mean([np.asarray(c[0], np.float64)[:3, 1] for c in cameras], axis=0)
        n = max(2, int(round(ORBIT_SECONDS * fps)))
        f = (H / 2) / math.tan(math.radians(ORBIT_FOV_DEG) / 2)
        K = np.array([[f, 0, W / 2 - 0.5], [0, f, H / 2 - 0.5], [0, 0, 1]])
        views = [(c2w, K) for c2w in orbit_poses(pts, centres, up, n)]
    else:
        views = [(np.asarray(c[0], np.float64), fit_intrinsics(c[1], (int(c[3]), int(c[2])), (W, H)))
                 for c in cameras]
    near, far = extent * 1e-3, extent * 20
    path = Path(path).expanduser()
    # OpenCV picks the container by the name's extension: the temp file ends in .mp4
    tmp = path.with_name(f".{path.name}.{os.getpid()}-video{TMP_SUFFIX}.mp4")
    writer = draw = None
    try:
        draw = renderer(pts, cols, centres, (W, H))
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"mp4v"), float(fps), (W, H))
        if not writer.isOpened():
            raise OutputError(f"video export: OpenCV cannot write an MP4 at {path}")
        for c2w, K in tqdm(views, desc="video", unit="frame", disable=not progress, leave=False,
                           dynamic_ncols=True):
            rgb = np.asarray(draw.render(clip_matrix(c2w, K, W, H, near, far)), np.uint8)
            frame = cv2.cvtColor(np.ascontiguousarray(rgb[..., :3]), cv2.COLOR_RGB2BGR)
            if frame.shape[:2] != (H, W):     # a high-DPI canvas renders larger
                frame = cv2.resize(frame, (W, H), interpolation=cv2.INTER_AREA)
            writer.write(frame)
        writer.release()
        writer = None
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        if writer is not None:
            writer.release()
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(f"Cannot write {path}: {exc.strerror or exc}") from None
        raise
    finally:
        if draw is not None:
            draw.close()
    return {"frames": len(views), "size": (W, H), "fps": float(fps), "file": str(path)}
