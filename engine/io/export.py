"""Exporters: PLY point cloud, NPZ arrays, TUM trajectory. Every file is written atomically.

    export_ply(path, points, colors, conf)      binary little-endian PLY: x y z float32,
                                                red green blue uint8, confidence float32
    export_npz(path, results, points, colors)   c2w [N,4,4], K [N,3,3] (for image_size
                                                [2] = h, w of depth and images), timestamps [N],
                                                depth / conf [N,h,w], has_depth [N], images
                                                [N,h,w,3], points [M,3], colors [M,3] uint8,
                                                point_conf [M], index, is_keyframe, segment
    export_tum(path, results)                   `t tx ty tz qx qy qz qw`, camera-to-world
    export_session(results, events, ...)        all of the above from one run, with the
                                                re-alignments applied and the points filtered
    export_results(source, outputs, ...)        THE export entry point of the GUI and the CLI:
                                                PLY, NPZ, TUM, COLMAP (engine.io.colmap) and
                                                GLB (engine.io.glb) with one set of options

Density: `stride` always counts pixels of the ENGINE'S RESULT resolution (what the viewer's
"Subsample" means too); a session stored at a lower resolution (old stores kept 256 px) gets the
equivalent stride at its own resolution. `conf_threshold` is in the engine's absolute confidence
units (the same number the viewer's threshold shows).
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
    # K is for the depth maps (and `images`, stored at the same size): say which size that is
    arrays["image_size"] = np.array(hw[:2], dtype=np.int64)
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
    """Export a run (PLY / NPZ / TUM): the older spelling of `export_results`, kept for callers.
    Returns {"frames": N, "points": M, "files": [...], ...}."""
    out = export_results(results, {"ply": ply, "npz": npz, "tum": trajectory}, events,
                         conf_threshold=conf_threshold, stride=stride)
    if ply is None and npz is None:
        out["points"] = 0
    return out


# --- one export function for the GUI and the CLI -----------------------------------------------

EXPORT_FORMATS = {
    "ply": "PLY point cloud (*.ply)",
    "npz": "NumPy arrays (*.npz)",
    "tum": "TUM trajectory (*.txt)",
    "colmap": "COLMAP text model (folder: images/ + sparse/0/)",
    "glb": "GLB scene: cloud, trajectory, frustums (*.glb)",
}
# an export keeping fewer than this fraction of the points at its stride (or fewer than
# FEW_POINTS) is "almost nothing": the GUI asks before writing, the CLI warns
ALMOST_NOTHING_FRACTION = 0.05
FEW_POINTS = 500


def _as_results(source, events=()) -> tuple[list, list, dict]:
    """(results, events, info) from a LoadedSession, a session folder or a list of results."""
    if isinstance(source, (str, Path)):
        from .store import load_session
        source = load_session(source)
    if hasattr(source, "results") and hasattr(source, "events"):
        return list(source.results), list(source.events) + list(events), dict(getattr(source, "info", {}) or {})
    return list(source), list(events), {}


def stored_stride(results: Sequence, stride: int, result_width: Optional[int] = None) -> int:
    """The step at the stored resolution equivalent to `stride` pixels at the engine's result
    resolution (`result_width`; None = the results are at result resolution)."""
    stride = max(1, int(stride))
    if not results or not result_width:
        return stride
    r = next((r for r in results if r.depth is not None), results[0])
    stored_w = (np.shape(r.depth) if r.depth is not None else np.shape(r.image))[1]
    return max(1, round(stride * stored_w / int(result_width)))


def select_results(results: Sequence, until: Optional[int] = None, keyframes_only: bool = False) -> list:
    """The results an export covers: index <= `until` (None = all), keyframes only on request."""
    return [r for r in results if (until is None or r.index <= until) and (r.is_keyframe or not keyframes_only)]


def count_points(results: Sequence, conf_threshold: float = 0.0, stride: int = 1) -> tuple[int, int]:
    """(points kept by the threshold, valid points at this stride) without back-projecting."""
    kept = total = 0
    for r in results:
        if r.depth is None:
            continue
        d = np.asarray(r.depth)[::stride, ::stride]
        valid = np.isfinite(d) & (d > 0)
        n = int(np.count_nonzero(valid))
        total += n
        if r.conf is None:
            kept += n
        else:
            kept += int(np.count_nonzero(valid & (np.asarray(r.conf)[::stride, ::stride] >= conf_threshold)))
    return kept, total


def almost_nothing(kept: int, total: int) -> Optional[str]:
    """A warning text if an export would keep almost none of the points, else None."""
    if total == 0:
        return "the session holds no depth: the export has no points"
    if kept < FEW_POINTS or kept < ALMOST_NOTHING_FRACTION * total:
        return (f"the confidence threshold keeps only {kept:,} of {total:,} points "
                f"({100.0 * kept / total:.1f} %)")
    return None


def plan_export(source, events=(), *, conf_threshold: float = 0.0, stride: int = 1,
                until: Optional[int] = None, keyframes_only: bool = False,
                result_width: Optional[int] = None) -> dict:
    """What `export_results` would write, without writing: {"frames", "points", "points_total",
    "stride_stored", "warning"} (warning: None or the "almost nothing" text)."""
    results, _, _ = _as_results(source, events)
    sel = select_results(results, until, keyframes_only)
    s = stored_stride(sel, stride, result_width)
    kept, total = count_points(sel, conf_threshold, s)
    return {"frames": len(sel), "points": kept, "points_total": total, "stride_stored": s,
            "warning": almost_nothing(kept, total)}


def _frame_parts(r, conf_threshold: float, stride: int):
    """(points, colors, conf, uv [M,2] pixel coordinates in r.image) of one result."""
    from ..geometry import backproject, image_at

    if r.depth is None:
        z = np.zeros((0, 3), np.float32)
        return z, np.zeros((0, 3), np.uint8), np.zeros(0, np.float32), np.zeros((0, 2))
    h, w = np.shape(r.depth)
    pts, mask = backproject(r.depth, r.K, r.c2w, stride, r.conf,
                            conf_threshold if r.conf is not None else -np.inf)
    vs, us = np.nonzero(mask)
    img = np.asarray(r.image)
    colors = image_at(img, h, w)[mask].astype(np.uint8)
    conf = (np.asarray(r.conf, np.float32)[mask] if r.conf is not None else np.ones(len(pts), np.float32))
    ih, iw = img.shape[:2] if img.size else (h, w)
    # pixel centres map between sizes as (u + 0.5) * s - 0.5
    uv = np.stack([(us + 0.5) * iw / w - 0.5, (vs + 0.5) * ih / h - 0.5], axis=1)
    return pts, colors, conf, uv


def export_results(source, outputs: dict, events: Iterable = (), *, conf_threshold: float = 0.0,
                   stride: int = 1, until: Optional[int] = None, keyframes_only: bool = False,
                   frustums: bool = True, image_format: str = "jpg", glb_opencv_axes: bool = False,
                   result_width: Optional[int] = None, max_points: Optional[int] = None) -> dict:
    """Export a run in any of EXPORT_FORMATS with the same options everywhere.

    source: a LoadedSession, a session folder, or a sequence of FrameResults (then `events`).
    outputs: {format: path}; "colmap" is a folder (images/ + sparse/0/*.txt), the others files.
    conf_threshold: absolute confidence (points below are dropped; results without a
    confidence map are kept). stride: every N-th pixel at the engine's result resolution
    (`result_width` is that width when the stored results are smaller, e.g. old 256-px
    sessions). until: last frame index to include (review: the session up to frame N).
    keyframes_only: export keyframes only (all frames by default). frustums: draw camera
    frustums in the GLB. max_points: thin the exported points evenly (every k-th point of each
    frame) to at most this many — e.g. a COLMAP model to start Gaussian splatting from a dense
    session (None = all). Re-alignment events are applied first.

    Returns {"frames", "points", "points_total", "files", "warning", "cut_short"} (cut_short: why
    the session holds less than its run was asked for, "" if it does not); every file is written
    atomically and the COLMAP model registers every exported frame.
    """
    unknown = set(outputs) - set(EXPORT_FORMATS)
    if unknown:
        raise ExportError(f"unknown export format(s) {sorted(unknown)}; choose from {sorted(EXPORT_FORMATS)}")
    outputs = {k: v for k, v in outputs.items() if v}
    results, events, info = _as_results(source, events)
    aligned = sorted(apply_realignments(results, events), key=lambda r: r.index)
    sel = select_results(aligned, until, keyframes_only)
    if not sel:
        raise ExportError("nothing to export: no frames" + (f" up to frame {until}" if until is not None else ""))
    s = stored_stride(sel, stride, result_width)
    kept, total = count_points(sel, conf_threshold, s)
    files = []
    parts = None
    if {"ply", "npz", "colmap", "glb"} & set(outputs):
        parts = [_frame_parts(r, conf_threshold, s) for r in sel]
        n_all = sum(len(p[0]) for p in parts)
        if max_points and n_all > max_points:
            # every k-th point of each frame (tracks stay consistent): at most max_points in all
            k = -(-n_all // int(max_points))
            parts = [tuple(a[::k] for a in p) for p in parts]
        points = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, 3), np.float32)
        colors = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, 3), np.uint8)
        conf = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.float32)
    if "ply" in outputs:
        export_ply(outputs["ply"], points, colors, conf)
        files.append(str(outputs["ply"]))
    if "npz" in outputs:
        export_npz(outputs["npz"], sel, points, colors, conf)
        files.append(str(outputs["npz"]))
    if "tum" in outputs:
        export_tum(outputs["tum"], sel)
        files.append(str(outputs["tum"]))
    if "colmap" in outputs:
        from .colmap import export_colmap
        frames = [{"index": r.index, "c2w": r.c2w, "image": _colmap_image(r),
                   "K": _image_K(r), "points": p[0], "colors": p[1], "uv": p[3]}
                  for r, p in zip(sel, parts)]
        export_colmap(outputs["colmap"], frames, image_format=image_format)
        files.append(str(outputs["colmap"]))
    if "glb" in outputs:
        from .glb import export_glb
        cams = []
        for r in sel:
            img = _colmap_image(r)
            cams.append((r.c2w, _image_K(r), img.shape[1], img.shape[0], r.is_keyframe,
                         img if r.is_keyframe and np.size(r.image) else None))
        export_glb(outputs["glb"], points, colors, cams, frustums=frustums, opencv_axes=glb_opencv_axes)
        files.append(str(outputs["glb"]))
    return {"frames": len(sel), "points": kept if parts is None else int(len(points)),
            "points_total": total, "stride_stored": s, "files": files,
            "warning": almost_nothing(kept, total) if parts is not None else None,
            "cut_short": _cut_short(info)}


def _cut_short(info: dict) -> str:
    """Why the exported session is incomplete ("" if it is not, or for plain results): the
    reason its run recorded, or a run that never closed its store (see LoadedSession.cut_short)."""
    if not info:
        return ""
    if info.get("cut_short"):
        return str(info["cut_short"])
    return "" if info.get("finished") else "the run did not finish (killed or crashed)"


def _colmap_image(r) -> np.ndarray:
    img = np.asarray(r.image)
    if img.size:
        return img
    h, w = np.shape(r.depth) if r.depth is not None else (1, 1)
    return np.zeros((h, w, 3), np.uint8)


def _image_K(r) -> np.ndarray:
    """K for r.image (results keep K for the depth/image resolution; equal sizes in the store)."""
    from ..geometry import scale_intrinsics

    img = np.asarray(r.image)
    if r.depth is None or not img.size or img.shape[:2] == np.shape(r.depth):
        return np.asarray(r.K, np.float64)
    return scale_intrinsics(r.K, np.shape(r.depth), img.shape[:2])
