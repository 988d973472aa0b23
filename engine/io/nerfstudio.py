"""nerfstudio data folder export: what `ns-train ... nerfstudio-data --data DIR` (and splatfacto,
gsplat's nerfstudio loaders) read, following nerfstudio's documented `transforms.json` schema
(https://docs.nerf.studio/quickstart/data_conventions.html):

    DIR/transforms.json     camera_model "OPENCV" (no distortion: k1 k2 p1 p2 = 0), fl_x fl_y cx cy
                            w h at the top (a frame whose camera differs carries its own), frames[]
                            with file_path and transform_matrix (camera-to-world, 4x4), and
                            ply_file_path (the exported points, to initialise splats)
    DIR/images/NNNNNN.jpg   each exported frame's colour image (result resolution)
    DIR/sparse_pc.ply       the exported points (binary PLY, x y z + RGB), in the same world

Conventions, all handled here:
- cameras: nerfstudio uses OpenGL/Blender axes (x right, y up, looking down -z); ours are OpenCV's
  (y down, z forward), so each camera-to-world gets its y and z columns negated;
- world: nerfstudio's world is z-up; ours has y down (the first camera's), so the poses and the
  points are turned by WORLD_Z_UP (x, y, z) -> (x, z, -y), recorded as "applied_transform" (3x4,
  nerfstudio's own key for the transform applied to the source's world);
- pixels: nerfstudio (like COLMAP) puts the centre of the top-left pixel at (0.5, 0.5), OpenCV's K
  at (0, 0): cx, cy are K's plus 0.5.

Streamed: one frame's image at a time, points written frame by frame; the frames' small records
(pose, file name) are kept for the JSON written at the end. A stop midway removes the images it
added and leaves no JSON or PLY behind.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterable, Union

import numpy as np

from .atomic import OutputError, atomic_open

PathLike = Union[str, Path]

WORLD_Z_UP = np.array([[1.0, 0, 0], [0, 0, 1.0], [0, -1.0, 0]])
OPENGL_FROM_OPENCV = np.diag([1.0, -1.0, -1.0])
PLY_NAME = "sparse_pc.ply"


def transform_matrix(c2w: np.ndarray) -> np.ndarray:
    """nerfstudio's transform_matrix (camera-to-world, OpenGL camera axes, z-up world) of one of
    our camera-to-world poses (OpenCV axes)."""
    c2w = np.asarray(c2w, np.float64)
    M = np.eye(4)
    M[:3, :3] = WORLD_Z_UP @ c2w[:3, :3] @ OPENGL_FROM_OPENCV
    M[:3, 3] = WORLD_Z_UP @ c2w[:3, 3]
    return M


def _intrinsics(K: np.ndarray, w: int, h: int) -> dict:
    K = np.asarray(K, np.float64)
    return {"fl_x": float(K[0, 0]), "fl_y": float(K[1, 1]), "cx": float(K[0, 2]) + 0.5,
            "cy": float(K[1, 2]) + 0.5, "w": int(w), "h": int(h)}


def export_nerfstudio(folder: PathLike, frames: Iterable, image_format: str = "jpg") -> dict:
    """Write a nerfstudio data folder. `frames`: in trajectory order, dicts with `index`, `c2w`,
    `K` (for `image`), `image` (h x w x 3 uint8 RGB) and optionally `points` [M,3], `colors`
    [M,3] uint8. Returns {"frames": N, "points": M, "folder": str}."""
    from .colmap import _encode
    from .ply import ply_writer

    ext = "." + image_format.lower().lstrip(".").replace("jpeg", "jpg")
    if ext not in (".jpg", ".png"):
        raise OutputError(f"nerfstudio export: image format must be jpg or png, got {image_format!r}")
    folder = Path(folder).expanduser()
    images_dir = folder / "images"
    try:
        images_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"nerfstudio export: cannot create {folder}: {exc.strerror or exc}") from None
    added: list = []
    records: list = []
    n_points = 0
    try:
        with contextlib.ExitStack() as commit:
            add = commit.enter_context(ply_writer(folder / PLY_NAME))
            for f in frames:
                img = np.asarray(f["image"], np.uint8)
                h, w = img.shape[:2]
                name = f"{int(f['index']):06d}{ext}"
                if not (images_dir / name).exists():
                    added.append(images_dir / name)
                with atomic_open(images_dir / name, "wb") as fh:
                    fh.write(_encode(img, ext))
                records.append((f"images/{name}", transform_matrix(f["c2w"]), _intrinsics(f["K"], w, h)))
                pts = f.get("points")
                if pts is not None and len(pts):
                    add(np.asarray(pts, np.float64).reshape(-1, 3) @ WORLD_Z_UP.T, f["colors"])
                    n_points += len(pts)
            if not records:
                raise OutputError("nerfstudio export: no frames")
            top = records[0][2]
            body = {"camera_model": "OPENCV", **top, "k1": 0.0, "k2": 0.0, "p1": 0.0, "p2": 0.0,
                    "applied_transform": np.column_stack([WORLD_Z_UP, np.zeros(3)]).tolist(),
                    "ply_file_path": PLY_NAME, "frames": []}
            for path, M, intr in records:
                fr = {"file_path": path, "transform_matrix": M.tolist()}
                if intr != top:           # per-frame intrinsics override the top-level ones
                    fr.update(intr)
                body["frames"].append(fr)
            # the JSON is renamed into place with the PLY, after every image
            fh = commit.enter_context(atomic_open(folder / "transforms.json", "w"))
            json.dump(body, fh, indent=1)
    except BaseException:
        for p in added:
            with contextlib.suppress(OSError):
                p.unlink()
        raise
    return {"frames": len(records), "points": n_points, "folder": str(folder)}
