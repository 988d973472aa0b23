"""rerun recording export (`.rrd`): a session as the rerun viewer shows it (`rerun FILE.rrd`).

Entities (world in our OpenCV axes, declared RDF: x right, y down, z forward):

    world                   ViewCoordinates RDF (static)
    world/trajectory        every exported camera centre as one line strip (static)
    world/camera            per frame: Transform3D (camera-to-world) and Pinhole (K of the image,
                            its resolution; the camera looks down +z, rerun's default RDF)
    world/camera/image      per frame: the colour image (JPEG, as the session stores it)
    world/camera/depth      per frame with depth: DepthImage in scene units (meter = 1), at the
                            image's size
    world/points            per frame: that frame's points (the export's threshold and stride)

Timelines: "frame" (the frame index) and "time" (its timestamp in seconds). The viewer shows the
current frame's points; set the 3D view's visible time range of world/points to "all" to see the
cloud accumulated. Written by rerun's own file sink as the frames stream (memory: one frame and
the sink's batch), into a temp file renamed into place at the end.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from .atomic import TMP_SUFFIX, OutputError

PathLike = Union[str, Path]
APP_ID = "ReconStudio"
JPEG_QUALITY = 90


def _rerun():
    try:
        import rerun as rr
    except ImportError:
        raise OutputError("the .rrd export needs the rerun SDK: pip install 'reconstudio[share]' "
                          "(or pip install rerun-sdk)") from None
    return rr


def export_rrd(path: PathLike, frames: Iterable, centres: Optional[np.ndarray] = None) -> dict:
    """Write a rerun recording. `frames`: in trajectory order, dicts with `index`, `timestamp`,
    `c2w`, `K` (for `image`), `image` (h x w x 3 uint8 RGB), optionally `depth` (any size),
    `points` [M,3] and `colors` [M,3] uint8. `centres`: the camera centres [N,3] for the static
    trajectory (default: none). Returns {"frames": N, "points": M, "file": str}."""
    import cv2

    rr = _rerun()
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=TMP_SUFFIX, dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise OutputError(f"Cannot write {path}: {exc.strerror or exc}") from None
    rec = rr.RecordingStream(APP_ID, recording_id=str(uuid.uuid4()))
    n = n_points = 0
    try:
        rec.save(tmp)
        rec.log("world", rr.ViewCoordinates.RDF, static=True)
        if centres is not None and len(centres) >= 2:
            rec.log("world/trajectory", rr.LineStrips3D([np.asarray(centres, np.float32)], colors=[[255, 120, 40]]),
                    static=True)
        for f in frames:
            rec.set_time("frame", sequence=int(f["index"]))
            rec.set_time("time", duration=float(f["timestamp"]))
            c2w = np.asarray(f["c2w"], np.float64)
            img = np.asarray(f["image"], np.uint8)
            h, w = img.shape[:2]
            rec.log("world/camera", rr.Transform3D(translation=c2w[:3, 3], mat3x3=c2w[:3, :3]),
                    rr.Pinhole(image_from_camera=np.asarray(f["K"], np.float64), resolution=[w, h]))
            ok, jpg = cv2.imencode(".jpg", cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2BGR),
                                   [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
            if ok:
                rec.log("world/camera/image", rr.EncodedImage(contents=jpg.tobytes(), media_type="image/jpeg"))
            depth = f.get("depth")
            if depth is not None:
                d = np.nan_to_num(np.asarray(depth, np.float32), nan=0.0, posinf=0.0, neginf=0.0)
                if d.shape != (h, w):       # under the image's pinhole: the image's size
                    d = cv2.resize(d, (w, h), interpolation=cv2.INTER_NEAREST)
                rec.log("world/camera/depth", rr.DepthImage(d, meter=1.0))
            pts = f.get("points")
            if pts is not None and len(pts):
                rec.log("world/points", rr.Points3D(np.asarray(pts, np.float32),
                                                    colors=np.asarray(f["colors"], np.uint8)))
                n_points += len(pts)
            else:                           # this frame adds no point: clear the last frame's
                rec.log("world/points", rr.Clear(recursive=False))
            n += 1
        rec.flush()
        rec.disconnect()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            rec.disconnect()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"Cannot write {path}: {exc.strerror or exc}") from None
        raise
    return {"frames": n, "points": n_points, "file": str(path)}


def read_cameras(path: PathLike) -> dict:
    """{frame index: (translation [3], K [3,3])} of a recording written by export_rrd, read back
    with rerun's chunk reader (tests, and a check that a file holds what a session held)."""
    _rerun()
    from rerun.chunk import RrdReader

    trans, pinhole = {}, {}
    for chunk in RrdReader(str(path)).store().stream().to_chunks():
        if chunk.entity_path != "/world/camera" or chunk.is_static:
            continue
        b = chunk.to_record_batch()
        names = b.schema.names
        frames = b.column("frame").to_pylist()
        if "Transform3D:translation" in names:
            for i, t in zip(frames, b.column("Transform3D:translation").to_pylist()):
                if t:
                    trans[i] = np.asarray(t[0], np.float64)
        if "Pinhole:image_from_camera" in names:
            for i, k in zip(frames, b.column("Pinhole:image_from_camera").to_pylist()):
                if k:   # stored column-major
                    pinhole[i] = np.asarray(k[0], np.float64).reshape(3, 3).T
    return {i: (trans[i], pinhole.get(i)) for i in trans}
