"""Exporters: PLY point cloud, NPZ arrays, TUM trajectory. Every file is written atomically.

    export_ply(path, points, colors, conf)      binary little-endian PLY: x y z float32,
                                                red green blue uint8, confidence float32
    export_npz(path, results, points, colors)   c2w [N,4,4], K [N,3,3], timestamps [N],
                                                depth / conf [N,h,w], has_depth [N], images
                                                [N,h,w,3], points [M,3], colors [M,3] uint8,
                                                point_conf [M], index, is_keyframe, segment
    export_tum(path, results)                   `t tx ty tz qx qy qz qw`, camera-to-world
    export_session(results, events, ...)        all of the above from one run, with the
                                                re-alignments applied and the points filtered
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from ..api import EngineError
from ..geometry import apply_realignments, collect_points
from .atomic import OutputError, atomic_open

PathLike = Union[str, Path]

PLY_VERTEX_DTYPE = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"),
                             ("red", "u1"), ("green", "u1"), ("blue", "u1"),
                             ("confidence", "<f4")])


class ExportError(OutputError):
    """An export could not be written or its inputs are inconsistent."""


class TrajectoryError(EngineError):
    """A TUM trajectory file could not be parsed."""


def export_ply(path: PathLike, points: np.ndarray, colors: np.ndarray, conf: Optional[np.ndarray] = None) -> int:
    """Write a binary little-endian PLY; returns the number of vertices written."""
    from plyfile import PlyData, PlyElement

    points = np.asarray(points, dtype=np.float32).reshape(-1, 3)
    colors = np.asarray(colors).reshape(-1, 3)
    n = len(points)
    if len(colors) != n:
        raise ExportError(f"PLY export: {n} points but {len(colors)} colours")
    if conf is None:
        conf = np.ones(n, np.float32)
    conf = np.asarray(conf, dtype=np.float32).reshape(-1)
    if len(conf) != n:
        raise ExportError(f"PLY export: {n} points but {len(conf)} confidences")
    vertex = np.empty(n, dtype=PLY_VERTEX_DTYPE)
    vertex["x"], vertex["y"], vertex["z"] = points[:, 0], points[:, 1], points[:, 2]
    colors = np.clip(colors, 0, 255).astype(np.uint8)
    vertex["red"], vertex["green"], vertex["blue"] = colors[:, 0], colors[:, 1], colors[:, 2]
    vertex["confidence"] = conf
    ply = PlyData([PlyElement.describe(vertex, "vertex")], text=False, byte_order="<",
                  comments=["ReconStudio point cloud (camera-to-world, OpenCV axes)"])
    with atomic_open(path, "wb") as f:
        ply.write(f)
    return n


def _stack(arrays: list, name: str) -> np.ndarray:
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ExportError(f"NPZ export: the frames' {name} maps have different sizes {sorted(shapes)}; "
                          "export from the session store (it keeps one resolution)")
    return np.stack(arrays)


def export_npz(path: PathLike, results: Sequence, points: Optional[np.ndarray] = None,
               colors: Optional[np.ndarray] = None, conf: Optional[np.ndarray] = None) -> None:
    """Write the per-frame arrays of `results` and the point cloud into one .npz (uncompressed,
    loadable with np.load(allow_pickle=False)). depth/conf [N,h,w] are always there (zeros for a
    frame without depth, `has_depth` says which; ones for a missing confidence); images
    [N,h,w,3] and pose_enc [N,9] when every frame has them."""
    results = list(results)
    n = len(results)
    arrays = {
        "c2w": np.array([np.asarray(r.c2w, np.float64) for r in results]).reshape(n, 4, 4),
        "K": np.array([np.asarray(r.K, np.float64) for r in results]).reshape(n, 3, 3),
        "timestamps": np.array([r.timestamp for r in results], dtype=np.float64),
        "index": np.array([r.index for r in results], dtype=np.int64),
        "is_keyframe": np.array([r.is_keyframe for r in results], dtype=bool),
        "segment": np.array([r.segment for r in results], dtype=np.int64),
    }
    # depth / conf always present: a frame without depth (e.g. a non-keyframe of the geometric
    # engine) is all zeros (0 = no depth) and flagged in has_depth
    with_depth = [r for r in results if r.depth is not None]
    hw = (np.shape(with_depth[0].depth) if with_depth
          else np.shape(results[0].image)[:2] if n else (0, 0))
    arrays["has_depth"] = np.array([r.depth is not None for r in results], dtype=bool)
    arrays["depth"] = _stack([np.asarray(r.depth, np.float32) if r.depth is not None
                              else np.zeros(hw, np.float32) for r in results], "depth") if n \
        else np.zeros((0, *hw), np.float32)
    arrays["conf"] = _stack([np.asarray(r.conf, np.float32) if r.conf is not None
                             else (np.ones(hw, np.float32) if r.depth is not None else np.zeros(hw, np.float32))
                             for r in results], "conf") if n else np.zeros((0, *hw), np.float32)
    if n and all(r.image is not None and np.size(r.image) for r in results):
        images = [np.asarray(r.image, np.uint8) for r in results]
        if len({a.shape for a in images}) == 1:
            arrays["images"] = np.stack(images)
    if n and all(r.pose_enc is not None for r in results):
        arrays["pose_enc"] = np.array([np.asarray(r.pose_enc, np.float32) for r in results])
    arrays["points"] = (np.zeros((0, 3), np.float32) if points is None
                        else np.asarray(points, np.float32).reshape(-1, 3))
    arrays["colors"] = (np.zeros((0, 3), np.uint8) if colors is None
                        else np.asarray(colors).reshape(-1, 3).astype(np.uint8))
    if len(arrays["colors"]) != len(arrays["points"]):
        raise ExportError(f"NPZ export: {len(arrays['points'])} points but {len(arrays['colors'])} colours")
    if conf is not None:
        arrays["point_conf"] = np.asarray(conf, np.float32).reshape(-1)
    with atomic_open(path, "wb") as f:
        np.savez_compressed(f, **arrays)   # mostly-empty depth maps shrink ~10x


def tum_lines(results: Iterable) -> list[str]:
    """`t tx ty tz qx qy qz qw` per result (camera-to-world; quaternion scalar-last)."""
    from scipy.spatial.transform import Rotation

    results = list(results)
    if not results:
        return []
    c2w = np.array([np.asarray(r.c2w, dtype=np.float64) for r in results]).reshape(-1, 4, 4)
    q = Rotation.from_matrix(c2w[:, :3, :3]).as_quat()     # x, y, z, w
    q[q[:, 3] < 0] *= -1                                   # one canonical sign
    return [f"{float(r.timestamp):.6f} " + " ".join(f"{v:.9f}" for v in (*t, *qi))
            for r, t, qi in zip(results, c2w[:, :3, 3], q)]


def export_tum(path: PathLike, results: Iterable) -> int:
    """Write a TUM trajectory, one line per result in the given order; returns the line count."""
    lines = tum_lines(results)
    with atomic_open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return len(lines)


def read_tum(path: PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(timestamps [N], c2w [N,4,4]) from a TUM file ('#' comments ignored); a malformed line
    raises TrajectoryError naming the file and line."""
    from scipy.spatial.transform import Rotation

    path = Path(path)
    rows = []
    for ln, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 8:
            raise TrajectoryError(f"{path}:{ln}: expected 8 numbers 't tx ty tz qx qy qz qw', got {len(parts)}")
        try:
            rows.append([float(x) for x in parts])
        except ValueError:
            raise TrajectoryError(f"{path}:{ln}: not a number in {line!r}") from None
    data = np.array(rows, np.float64).reshape(-1, 8)
    c2w = np.tile(np.eye(4), (len(data), 1, 1))
    if len(data):
        c2w[:, :3, :3] = Rotation.from_quat(data[:, 4:8]).as_matrix()
        c2w[:, :3, 3] = data[:, 1:4]
    return data[:, 0], c2w


def export_session(results: Sequence, events: Iterable = (), *, ply: Optional[PathLike] = None,
                   npz: Optional[PathLike] = None, trajectory: Optional[PathLike] = None,
                   conf_threshold: float = 0.0, stride: int = 1) -> dict:
    """Export a run: re-alignments applied per segment, points filtered by `conf_threshold`
    and subsampled every `stride` pixels. Returns {"frames": N, "points": M, "files": [...]}."""
    aligned = sorted(apply_realignments(list(results), list(events)), key=lambda r: r.index)
    files = []
    points = colors = conf = None
    if ply is not None or npz is not None:
        points, colors, conf = collect_points(aligned, conf_threshold, stride)
    if ply is not None:
        export_ply(ply, points, colors, conf)
        files.append(str(ply))
    if npz is not None:
        export_npz(npz, aligned, points, colors, conf)
        files.append(str(npz))
    if trajectory is not None:
        export_tum(trajectory, aligned)
        files.append(str(trajectory))
    return {"frames": len(aligned), "points": 0 if points is None else len(points), "files": files}
