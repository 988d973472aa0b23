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
                                                PLY, NPZ, TUM, COLMAP (engine.io.colmap),
                                                nerfstudio (engine.io.nerfstudio), OBJ, GLB
                                                (engine.io.glb), rerun .rrd (engine.io.rrd) and
                                                MP4 (engine.io.video) with one set of options

Memory: export_results streams a session folder one frame at a time (engine.io.session_reader):
the trajectory reads the poses only; PLY, OBJ, nerfstudio, RRD and NPZ are written frame by frame
(memory: one frame); COLMAP keeps the frames of its co-visibility window (points and a per-cell
depth map each) and streams its records; GLB and the video keep their own output (points,
records) and one image at a time. Exports are
written small first (EXPORT_ORDER), each atomically, so a stop during them keeps the finished ones.

Density: `stride` always counts pixels of the ENGINE'S RESULT resolution (what the viewer's
"Subsample" means too); a session stored at a lower resolution (old stores kept 256 px) gets the
equivalent stride at its own resolution. `conf_threshold` is in the engine's absolute confidence
units (the same number the viewer's threshold shows).
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np

from ..api import EngineError
from .atomic import TMP_SUFFIX, OutputError, atomic_open
from .ply import PLY_VERTEX_DTYPE, ply_writer

PathLike = Union[str, Path]


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
        np.savez_compressed(f, **arrays)   # mostly-empty depth maps compress well


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
    "nerfstudio": "nerfstudio data (folder: transforms.json + images/ + sparse_pc.ply)",
    "obj": "OBJ point cloud with vertex colours, for Blender (*.obj)",
    "rrd": "rerun recording: points, cameras, images, depth per frame (*.rrd)",
    "video": "MP4 video of the camera path or an orbit (*.mp4)",
}
# an export keeping fewer than this fraction of the points at its stride (or fewer than
# FEW_POINTS) is "almost nothing": the GUI asks before writing, the CLI warns
ALMOST_NOTHING_FRACTION = 0.05
FEW_POINTS = 500


def _as_results(source, events=()) -> tuple[list, list, dict]:
    """(results, events, info) from a LoadedSession, a session folder or a list of results.
    Holds every frame in memory: for small sessions and tests only; exports stream
    (engine.io.session_reader)."""
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
    """The results an export covers: index <= `until` (None = all), keyframes only on request.
    Works on FrameResults and on session_reader.FramePose alike."""
    return [r for r in results if (until is None or r.index <= until) and (r.is_keyframe or not keyframes_only)]


def _frame_count(r, conf_threshold: float, stride: int) -> tuple[int, int]:
    """(points kept by the threshold, valid points at this stride) of one result."""
    if r.depth is None:
        return 0, 0
    d = np.asarray(r.depth)[::stride, ::stride]
    valid = np.isfinite(d) & (d > 0)
    n = int(np.count_nonzero(valid))
    if r.conf is None:
        return n, n
    return int(np.count_nonzero(valid & (np.asarray(r.conf)[::stride, ::stride] >= conf_threshold))), n


def count_points(results: Iterable, conf_threshold: float = 0.0, stride: int = 1) -> tuple[int, int]:
    """(points kept by the threshold, valid points at this stride) without back-projecting."""
    kept = total = 0
    for r in results:
        k, n = _frame_count(r, conf_threshold, stride)
        kept += k
        total += n
    return kept, total


def almost_nothing(kept: int, total: int) -> Optional[str]:
    """A warning text if an export would keep almost none of the points, else None."""
    if total == 0:
        return "the session holds no depth: the export has no points"
    if kept < FEW_POINTS or kept < ALMOST_NOTHING_FRACTION * total:
        return (f"the confidence threshold keeps only {kept:,} of {total:,} points "
                f"({100.0 * kept / total:.1f} %)")
    return None


class EmptyExportError(ExportError):
    """An export would hold no point (PLY, GLB, COLMAP, NPZ) or no pose (trajectory). `files`:
    what the same call did write (the exports that were not empty)."""

    def __init__(self, message: str, files: Sequence = ()):
        super().__init__(message)
        self.files = list(files)


# the geometric engine's first depth map needs its map initialised and a keyframe's stereo
NO_DEPTH_HINT = ("no frame has depth yet: the geometric engine computes its first depth map once its "
                 "map is initialised (some sideways motion) and a keyframe has a stereo partner, "
                 "some tens of frames into a clip, and none with --no-depth")


def _no_points_reason(reader, sel, conf_threshold: float) -> str:
    if not any(p.has_depth for p in sel):
        engine = str((reader.info or {}).get("engine") or getattr(reader.config, "engine", "") or "")
        return NO_DEPTH_HINT if engine == "geometric" else "no exported frame has a depth map"
    return (f"the confidence threshold {conf_threshold:g} keeps none of the points "
            "(lower --conf-threshold / the viewer's Min confidence)")


def _stride_from_reader(reader, sel, stride: int, result_width: Optional[int]) -> int:
    """stored_stride of a streamed session: one frame with depth decoded for its width."""
    stride = max(1, int(stride))
    if not result_width or not sel:
        return stride
    first = next((p for p in sel if p.has_depth), sel[0])
    return stored_stride([reader.frame(first)], stride, result_width)


def _progress(enabled: bool, total: int, desc: str):
    """A tqdm bar on stderr that shows only when a pass takes more than a couple of seconds."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="frame", file=sys.stderr, disable=not enabled,
                delay=PROGRESS_DELAY_S, dynamic_ncols=True, leave=False)


def _count_pass(reader, sel, conf_threshold: float, stride: int, progress: bool,
                stop_at_first: bool = False) -> tuple[int, int]:
    """count_points over the selection, streamed (stop_at_first: stop once a point is kept)."""
    kept = total = 0
    with _progress(progress, len(sel), "counting points") as bar:
        for p in sel:
            if p.has_depth:
                k, n = _frame_count(reader.frame(p), conf_threshold, stride)
                kept += k
                total += n
                if stop_at_first and kept:
                    break
            bar.update(1)
    return kept, total


def plan_export(source, events=(), *, conf_threshold: float = 0.0, stride: int = 1,
                until: Optional[int] = None, keyframes_only: bool = False,
                result_width: Optional[int] = None) -> dict:
    """What `export_results` would write, without writing: {"frames", "points", "points_total",
    "stride_stored", "warning"} (warning: None or the "almost nothing" text). Streams the
    session one frame at a time."""
    from .session_reader import open_frames

    reader = open_frames(source, events)
    sel = select_results(reader.poses, until, keyframes_only)
    s = _stride_from_reader(reader, sel, stride, result_width)
    kept, total = _count_pass(reader, sel, conf_threshold, s, progress=False)
    return {"frames": len(sel), "points": kept, "points_total": total, "stride_stored": s,
            "warning": almost_nothing(kept, total)}


def _frame_parts(r, conf_threshold: float, stride: int, with_uv: bool = True):
    """(points, colors, conf, uv [M,2] pixel coordinates in r.image, or None without with_uv)
    of one result."""
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
    if not with_uv:
        return pts, colors, conf, None
    ih, iw = img.shape[:2] if img.size else (h, w)
    # pixel centres map between sizes as (u + 0.5) * s - 0.5
    uv = np.stack([(us + 0.5) * iw / w - 0.5, (vs + 0.5) * ih / h - 0.5], axis=1)
    return pts, colors, conf, uv


class _PointStream:
    """The point exports' one way through the frames: per selected frame its FrameResult and
    (points, colors, conf, uv), thinned by every k-th point; counts what it kept."""

    def __init__(self, reader, sel, conf_threshold: float, stride: int, thin: int, progress: bool):
        self.reader, self.sel, self.conf_threshold, self.stride = reader, sel, conf_threshold, stride
        self.thin, self.progress = thin, progress
        self.kept = self.total = 0

    def frames(self, desc: str, with_uv: bool = False):
        self.kept = self.total = 0
        with _progress(self.progress, len(self.sel), desc) as bar:
            for pose in self.sel:
                r = self.reader.frame(pose)
                parts = _frame_parts(r, self.conf_threshold, self.stride, with_uv)
                self.total += _frame_count(r, self.conf_threshold, self.stride)[1]
                if self.thin > 1:     # copies: a strided view would keep the whole frame's arrays alive
                    parts = tuple(None if a is None else a[::self.thin].copy() for a in parts)
                self.kept += len(parts[0])
                yield pose, r, parts
                bar.update(1)


def export_results(source, outputs: dict, events: Iterable = (), *, conf_threshold: float = 0.0,
                   stride: int = 1, until: Optional[int] = None, keyframes_only: bool = False,
                   frustums: bool = True, image_format: str = "jpg", glb_opencv_axes: bool = False,
                   result_width: Optional[int] = None, max_points: Optional[int] = None,
                   video_size: tuple = (1280, 720), video_fps: float = 30.0, video_orbit: bool = False,
                   video_renderer=None, progress: bool = False) -> dict:
    """Export a run in any of EXPORT_FORMATS with the same options everywhere.

    source: a session folder (streamed one frame at a time: memory bounded by the exports' own
    output, not the session's length), a session_reader.FrameReader, a LoadedSession, or a
    sequence of FrameResults (then `events`).
    outputs: {format: path}; "colmap" and "nerfstudio" are folders (FOLDER_FORMATS), the others files.
    conf_threshold: absolute confidence (points below are dropped; results without a
    confidence map are kept). stride: every N-th pixel at the engine's result resolution
    (`result_width` is that width when the stored results are smaller, e.g. old 256-px
    sessions). until: last frame index to include (review: the session up to frame N).
    keyframes_only: export keyframes only (all frames by default). frustums: draw camera
    frustums in the GLB. max_points: thin the exported points evenly (every k-th point of each
    frame) to at most this many — e.g. a COLMAP model to start Gaussian splatting from a dense
    session (None = all). video_size (W, H), video_fps, video_orbit: the MP4's frame size, rate,
    and an orbit around the scene instead of the camera path; video_renderer: what draws it
    (engine.io.video.render_video's `renderer`, e.g. ui.video_render.OffscreenRenderer; the
    engine draws nothing itself). Re-alignment
    events are applied first. progress: tqdm bars on stderr
    for passes that take more than a couple of seconds.

    Written in EXPORT_ORDER (small first: the trajectory needs the poses only, the NPZ is the
    biggest), each file atomically: a kill leaves every export whole or absent, and the temp
    files of an earlier killed export to the same place are removed first. An export that
    would hold no point (no pose) raises EmptyExportError after the others are written.

    Returns {"frames", "points", "points_total", "files", "warning", "cut_short"} (cut_short: why
    the session holds less than its run was asked for, "" if it does not); the COLMAP model
    registers every exported frame, and holds the points that at least two frames see (with
    "colmap": its counts: images, points, observations, mean_track_length).
    """
    from .session_reader import open_frames

    unknown = set(outputs) - set(EXPORT_FORMATS)
    if unknown:
        raise ExportError(f"unknown export format(s) {sorted(unknown)}; choose from {sorted(EXPORT_FORMATS)}")
    outputs = {k: v for k, v in outputs.items() if v}
    for kind, path in outputs.items():
        _clean_leftovers(kind, path)
    if "video" in outputs and video_renderer is None:
        raise ExportError("the video export needs a renderer (ui.video_render.OffscreenRenderer)")
    reader = open_frames(source, events, progress=progress)
    sel = select_results(reader.poses, until, keyframes_only)
    if not sel:
        raise EmptyExportError("nothing to export: no frames" + (f" up to frame {until}" if until is not None
                                                                  else " (the session holds no frame)"))
    files: list = []
    point_kinds = [k for k in EXPORT_ORDER if k in outputs and k != "tum"]
    out = {"frames": len(sel), "points": 0, "points_total": 0, "stride_stored": max(1, int(stride)),
           "files": files, "warning": None, "cut_short": _cut_short(reader.info)}
    if "tum" in outputs:
        export_tum(outputs["tum"], sel)
        files.append(str(outputs["tum"]))
    if not point_kinds:
        return out
    s = _stride_from_reader(reader, sel, stride, result_width)
    out["stride_stored"] = s
    thin = 1
    if max_points:
        kept, total = _count_pass(reader, sel, conf_threshold, s, progress)
        if kept > max_points:
            thin = -(-kept // int(max_points))   # every k-th point of each frame: tracks stay whole
    elif any(p.has_depth for p in sel):
        kept, total = _count_pass(reader, sel, conf_threshold, s, False, stop_at_first=True)
    else:
        kept = total = 0
    if not kept:
        raise EmptyExportError(f"{', '.join(k.upper() for k in point_kinds)} not written: the export would "
                               f"hold 0 points ({_no_points_reason(reader, sel, conf_threshold)})", files)
    stream = _PointStream(reader, sel, conf_threshold, s, thin, progress)
    for kind in point_kinds:
        path = outputs[kind]
        if kind == "colmap":
            out["colmap"] = _export_colmap_stream(path, stream, image_format)
        elif kind == "ply":
            _export_ply_stream(path, stream)
        elif kind == "glb":
            _export_glb_stream(path, stream, frustums, glb_opencv_axes)
        elif kind == "nerfstudio":
            _export_nerfstudio_stream(path, stream, image_format)
        elif kind == "obj":
            _export_obj_stream(path, stream)
        elif kind == "rrd":
            _export_rrd_stream(path, stream)
        elif kind == "video":
            out["video"] = _export_video_stream(path, stream, video_renderer, video_size, video_fps,
                                                video_orbit, progress)
        else:
            _export_npz_stream(path, reader, sel, stream, progress)
        files.append(str(path))
        out["points"], out["points_total"] = int(stream.kept), int(stream.total)
    # almost nothing: judged before any thinning (max_points asks for fewer points on purpose)
    out["warning"] = almost_nothing(kept if thin > 1 else out["points"], out["points_total"])
    return out


EXPORT_ORDER = ("tum", "colmap", "nerfstudio", "ply", "obj", "glb", "rrd", "video", "npz")
FOLDER_FORMATS = ("colmap", "nerfstudio")     # written as a folder, the others as one file
PROGRESS_DELAY_S = 2.0


def _clean_leftovers(kind: str, path) -> None:
    """Temp files a killed export to this place left behind (engine.io.atomic.clean_temp_files)."""
    from .atomic import clean_temp_files
    path = Path(path).expanduser()
    if kind in FOLDER_FORMATS:
        for d in (path, path / "images", path / "sparse" / "0"):
            if d.is_dir():
                clean_temp_files(d)
    elif path.parent.is_dir():
        clean_temp_files(path.parent, path.name)
        if kind == "video":       # its temp file ends in .mp4 (engine.io.video): a dead writer's
            from .atomic import _pid_alive
            for p in path.parent.glob(f".{glob.escape(path.name)}.*-video{TMP_SUFFIX}.mp4"):
                pid = p.name[len(path.name) + 2:].split("-", 1)[0]
                if pid.isdigit() and not _pid_alive(int(pid)):
                    with contextlib.suppress(OSError):
                        p.unlink()


def _export_colmap_stream(folder, stream: "_PointStream", image_format: str) -> dict:
    from .colmap import export_colmap

    def frames():
        for pose, r, parts in stream.frames("COLMAP", with_uv=True):
            # the depth map decides which points of the other frames this one sees (tracks)
            yield {"index": r.index, "c2w": r.c2w, "image": _colmap_image(r), "K": _image_K(r),
                   "points": parts[0], "colors": parts[1], "uv": parts[3], "depth": r.depth,
                   "depth_K": r.K, "stride": stream.stride}
    return export_colmap(folder, frames(), image_format=image_format, n_frames=len(stream.sel))


def _export_nerfstudio_stream(folder, stream: "_PointStream", image_format: str) -> dict:
    from .nerfstudio import export_nerfstudio

    def frames():
        for pose, r, parts in stream.frames("nerfstudio"):
            yield {"index": r.index, "c2w": r.c2w, "image": _colmap_image(r), "K": _image_K(r),
                   "points": parts[0], "colors": parts[1]}
    return export_nerfstudio(folder, frames(), image_format=image_format)


# Blender's OBJ importer (and MeshLab, CloudCompare) read "v x y z r g b" as a coloured vertex
OBJ_FROM_OPENCV = np.diag([1.0, -1.0, -1.0])


def _export_obj_stream(path, stream: "_PointStream") -> int:
    """OBJ vertices with colours in [0, 1], no faces, written frame by frame. Turned upright as
    the GLB is (y up: y -> -y, z -> -z), since OBJ importers take y as up."""
    n = 0
    with atomic_open(path, "w") as f:
        f.write("# ReconStudio point cloud: v x y z r g b (colours 0..1), y up (OpenCV y and z negated)\n")
        for _, _, (pts, cols, _, _) in stream.frames("OBJ"):
            if len(pts):
                rows = np.column_stack([np.asarray(pts, np.float64) @ OBJ_FROM_OPENCV,
                                        np.asarray(cols, np.float64) / 255.0])
                f.write(("v %.6g %.6g %.6g %.4g %.4g %.4g\n" * len(rows)) % tuple(rows.ravel().tolist()))
                n += len(rows)
    return n


def _export_rrd_stream(path, stream: "_PointStream") -> dict:
    from .rrd import export_rrd

    def frames():
        for pose, r, parts in stream.frames("RRD"):
            yield {"index": r.index, "timestamp": r.timestamp, "c2w": r.c2w, "K": _image_K(r),
                   "image": _colmap_image(r), "depth": r.depth, "points": parts[0], "colors": parts[1]}
    return export_rrd(path, frames(), centres=np.array([p.c2w[:3, 3] for p in stream.sel]))


def _export_video_stream(path, stream: "_PointStream", renderer, size, fps, orbit: bool, progress: bool) -> dict:
    """The cloud gathered (thinned to about video.MAX_POINTS: whenever it grows past twice that,
    every other point is dropped and later frames give every other point), then rendered."""
    from .video import MAX_POINTS, render_video

    pts, cols, cams = [], [], []
    step, held = 1, 0
    for pose, r, parts in stream.frames("video (points)"):
        p, c = parts[0][::step], parts[1][::step]
        pts.append(p)
        cols.append(c)
        held += len(p)
        if held > 2 * MAX_POINTS:
            pts, cols = [a[::2].copy() for a in pts], [a[::2].copy() for a in cols]
            step *= 2
            held = sum(len(a) for a in pts)
        img = _colmap_image(r)
        cams.append((r.c2w, _image_K(r), img.shape[1], img.shape[0]))
    points = np.concatenate(pts) if pts else np.zeros((0, 3), np.float32)
    colors = np.concatenate(cols) if cols else np.zeros((0, 3), np.uint8)
    del pts, cols
    return render_video(path, points, colors, cams, renderer, size=size, fps=fps, orbit=orbit, progress=progress)


def _export_ply_stream(path, stream: "_PointStream") -> None:
    """Binary PLY written frame by frame."""
    with ply_writer(path) as add:
        for _, _, (pts, cols, conf, _) in stream.frames("PLY"):
            add(pts, cols, conf)


def _export_glb_stream(path, stream: "_PointStream", frustums: bool, opencv_axes: bool) -> dict:
    """The GLB holds its whole scene in memory (trimesh): the points kept, the cameras, and the
    images of the keyframes that get a thumbnail only."""
    from .glb import export_glb, thumbnail_picks

    kf_positions = [i for i, p in enumerate(stream.sel) if p.is_keyframe]
    thumbs = {kf_positions[j] for j in thumbnail_picks(len(kf_positions))}
    pts, cols, cams = [], [], []
    for i, (pose, r, parts) in enumerate(stream.frames("GLB")):
        pts.append(parts[0])
        cols.append(parts[1])
        img = _colmap_image(r)
        cams.append((r.c2w, _image_K(r), img.shape[1], img.shape[0], r.is_keyframe,
                     img if i in thumbs and np.size(r.image) else None))
    points = np.concatenate(pts) if pts else np.zeros((0, 3), np.float32)
    colors = np.concatenate(cols) if cols else np.zeros((0, 3), np.uint8)
    del pts, cols
    return export_glb(path, points, colors, cams, frustums=frustums, opencv_axes=opencv_axes)


def _npy_header(f, shape, dtype) -> None:
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                              "fortran_order": False, "shape": tuple(int(x) for x in shape)})


def _export_npz_stream(path, reader, sel, stream: "_PointStream", progress: bool) -> None:
    """The NPZ of `export_npz`, written member by member: each per-frame stack (depth, conf,
    images) is one pass over the frames straight into its zip member, the points go through
    temp files beside the output; memory holds one frame and the per-frame poses."""
    import tempfile
    import zipfile

    n = len(sel)
    first = next((p for p in sel if p.has_depth), None)
    hw = np.shape(reader.frame(first).depth if first is not None else reader.frame(sel[0]).image)[:2]
    hw = tuple(int(x) for x in hw)
    small = {
        "c2w": np.array([p.c2w for p in sel], np.float64).reshape(n, 4, 4),
        "K": np.array([p.K for p in sel], np.float64).reshape(n, 3, 3),
        "timestamps": np.array([p.timestamp for p in sel], np.float64),
        "index": np.array([p.index for p in sel], np.int64),
        "is_keyframe": np.array([p.is_keyframe for p in sel], bool),
        "segment": np.array([p.segment for p in sel], np.int64),
        "has_depth": np.array([p.has_depth for p in sel], bool),
        "image_size": np.array(hw, np.int64),
    }
    image_shapes: set = set()        # seen by the depth pass: `images` only when they all agree
    pose_enc: list = []

    def plane(r, name):
        if name == "depth":
            a = r.depth if r.depth is not None else np.zeros(hw, np.float32)
        else:
            a = (r.conf if r.conf is not None else
                 np.ones(hw, np.float32) if r.depth is not None else np.zeros(hw, np.float32))
        a = np.asarray(a, np.float32)
        if a.shape != hw:
            raise ExportError(f"NPZ export: the frames' {name} maps have different sizes {hw} and "
                              f"{a.shape}; export from the session store (it keeps one resolution)")
        return a

    path = Path(path).expanduser()
    tmp_files = []
    try:
        with atomic_open(path, "wb") as f, \
                zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED, compresslevel=NPZ_DEFLATE_LEVEL) as z:
            for name, a in small.items():
                with z.open(f"{name}.npy", "w", force_zip64=True) as m:
                    np.lib.format.write_array(m, a, allow_pickle=False)
            stacks = [("depth", np.float32, hw), ("conf", np.float32, hw), ("images", np.uint8, None)]
            for name, dtype, shape in stacks:
                if name == "images":
                    if len(image_shapes) != 1 or None in image_shapes:
                        continue
                    shape = next(iter(image_shapes))
                with z.open(f"{name}.npy", "w", force_zip64=True) as m, \
                        _progress(progress, n, f"NPZ ({name})") as bar:
                    _npy_header(m, (n, *shape), dtype)
                    for r in reader.frames(sel):
                        if name == "depth":
                            image_shapes.add(np.shape(r.image) if r.image is not None and np.size(r.image)
                                             else None)
                            pose_enc.append(None if r.pose_enc is None else np.asarray(r.pose_enc, np.float32))
                        a = np.asarray(r.image, np.uint8) if name == "images" else plane(r, name)
                        m.write(np.ascontiguousarray(a, dtype).tobytes())
                        bar.update(1)
            if all(e is not None for e in pose_enc):
                with z.open("pose_enc.npy", "w", force_zip64=True) as m:
                    np.lib.format.write_array(m, np.array(pose_enc), allow_pickle=False)
            del pose_enc
            # the points: one pass into three raw temp files, then each copied into its member
            cols = [("points", np.float32, 3, 0), ("colors", np.uint8, 3, 1), ("point_conf", np.float32, None, 2)]
            handles = []
            for name, *_ in cols:
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=TMP_SUFFIX,
                                           dir=path.parent)
                tmp_files.append(tmp)
                handles.append(os.fdopen(fd, "w+b"))
            try:
                for _, _, parts in stream.frames("NPZ (points)"):
                    for h, (_, dtype, _, j) in zip(handles, cols):
                        h.write(np.ascontiguousarray(parts[j], dtype).tobytes())
                m_pts = stream.kept
                for h, (name, dtype, width, _) in zip(handles, cols):
                    h.seek(0)
                    with z.open(f"{name}.npy", "w", force_zip64=True) as m:
                        _npy_header(m, (m_pts, width) if width else (m_pts,), dtype)
                        shutil.copyfileobj(h, m, COPY_CHUNK)
            finally:
                for h in handles:
                    h.close()
    finally:
        for tmp in tmp_files:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


NPZ_DEFLATE_LEVEL = 1       # as the store: far cheaper than zlib's default, nearly the same size
COPY_CHUNK = 1 << 22


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
