"""GLB (binary glTF 2.0) export through trimesh: the point cloud, the camera trajectory and,
optionally, the camera frustums, as one scene that Blender, three.js viewers and trimesh open.

Nodes (geometry names): "points" (a POINTS primitive with vertex colours), "trajectory" (LINES:
consecutive camera centres, orange), "frustums_keyframes" / "frustums" (LINES: apex to the image
corners and the image rectangle of each exported camera; keyframes blue, other frames grey) and
"thumbnail_NNNNNN" (a textured, double-sided quad in a keyframe's frustum showing its image, for
at most MAX_THUMBNAILS keyframes spread over the run).

glTF is y-up with the camera looking down -z; our world uses OpenCV axes (y down, z forward).
By default every coordinate is turned 180 degrees about x (y -> -y, z -> -z) so the scene stands
upright in glTF viewers; `opencv_axes=True` keeps the coordinates exactly as the other exports.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from ..geometry import camera_frustum
from .atomic import OutputError, atomic_open

PathLike = Union[str, Path]

TRAJECTORY_RGBA = (255, 120, 40, 255)
KEYFRAME_RGBA = (90, 170, 255, 255)
FRAME_RGBA = (150, 150, 160, 255)
GLTF_FROM_OPENCV = np.diag([1.0, -1.0, -1.0])
MAX_THUMBNAILS = 64
THUMB_WIDTH = 160


def thumbnail_picks(n_keyframes: int) -> np.ndarray:
    """Which of `n_keyframes` keyframes (with images, in order) get a thumbnail: all, or
    MAX_THUMBNAILS spread over the run. Lets a streamed export keep only those images."""
    if n_keyframes <= MAX_THUMBNAILS:
        return np.arange(n_keyframes)
    return np.unique(np.linspace(0, n_keyframes - 1, MAX_THUMBNAILS).round().astype(int))


def _lines(segments: np.ndarray, rgba, name: str):
    """A trimesh Path3D of independent segments [S,2,3] in one colour."""
    import trimesh
    from trimesh.path.entities import Line

    segments = np.asarray(segments, np.float64).reshape(-1, 2, 3)
    verts = segments.reshape(-1, 3)
    entities = [Line(points=[2 * i, 2 * i + 1]) for i in range(len(segments))]
    path = trimesh.path.Path3D(entities=entities, vertices=verts, process=False)
    path.colors = np.tile(np.asarray(rgba, np.uint8), (len(entities), 1))
    path.metadata["name"] = name
    return path


def _thumbnail(corners: np.ndarray, image: np.ndarray):
    """A double-sided quad on the image rectangle (corners TL, TR, BR, BL) textured with `image`."""
    import trimesh
    from PIL import Image

    step = max(1, int(image.shape[1]) // THUMB_WIDTH)
    img = Image.fromarray(np.ascontiguousarray(np.asarray(image, np.uint8)[::step, ::step, :3]))
    uv = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])     # TL TR BR BL, v up
    mat = trimesh.visual.material.PBRMaterial(baseColorTexture=img, doubleSided=True,
                                              metallicFactor=0.0, roughnessFactor=1.0)
    return trimesh.Trimesh(np.asarray(corners, np.float64), np.array([[0, 1, 2], [0, 2, 3]]),
                           visual=trimesh.visual.TextureVisuals(uv=uv, material=mat), process=False)


def export_glb(path: PathLike, points: np.ndarray, colors: np.ndarray, cameras: Sequence,
               frustums: bool = True, frustum_size: Optional[float] = None,
               opencv_axes: bool = False, thumbnails: bool = True) -> dict:
    """Write the scene; `cameras` is a sequence of (c2w 4x4, K 3x3, width, height, is_keyframe)
    or (..., is_keyframe, image) in trajectory order; keyframes with an image get a thumbnail
    (thumbnails=True, with frustums). `frustum_size` is the drawn depth of a frustum in scene units (default:
    3 % of the cloud's extent). Returns {"points": M, "cameras": N, "file": str}."""
    import trimesh

    A = np.eye(3) if opencv_axes else GLTF_FROM_OPENCV
    pts = np.asarray(points, np.float64).reshape(-1, 3) @ A.T
    cols = np.asarray(colors, np.uint8).reshape(-1, 3)
    if len(cols) != len(pts):
        raise OutputError(f"GLB export: {len(pts)} points but {len(cols)} colours")
    scene = trimesh.Scene()
    if len(pts):
        rgba = np.concatenate([cols, np.full((len(cols), 1), 255, np.uint8)], axis=1)
        scene.add_geometry(trimesh.PointCloud(pts, colors=rgba), geom_name="points", node_name="points")
    centres = np.array([np.asarray(c[0], np.float64)[:3, 3] for c in cameras]).reshape(-1, 3) @ A.T
    if len(centres) >= 2:
        scene.add_geometry(_lines(np.stack([centres[:-1], centres[1:]], 1), TRAJECTORY_RGBA, "trajectory"),
                           geom_name="trajectory", node_name="trajectory")
    if frustums and len(cameras):
        if frustum_size is None:
            ref = pts if len(pts) else centres
            extent = float(np.linalg.norm(np.ptp(ref, axis=0))) if len(ref) > 1 else 1.0
            frustum_size = 0.03 * (extent or 1.0)
        thumbs = []
        for kf, name, rgba in ((True, "frustums_keyframes", KEYFRAME_RGBA), (False, "frustums", FRAME_RGBA)):
            segs = []
            for cam in cameras:
                c2w, K, w, h, is_kf = cam[:5]
                if bool(is_kf) != kf:
                    continue
                corners, _ = camera_frustum(K, c2w, int(w), int(h), near=frustum_size, look_depth=frustum_size)
                c = corners.astype(np.float64) @ A.T
                apex, rect = c[0], c[1:5]
                segs += [(apex, p) for p in rect] + [(rect[i], rect[(i + 1) % 4]) for i in range(4)]
                if kf and thumbnails and len(cam) > 5 and cam[5] is not None and np.size(cam[5]):
                    thumbs.append((rect, cam[5]))
            if segs:
                scene.add_geometry(_lines(np.array(segs), rgba, name), geom_name=name, node_name=name)
        if len(thumbs) > MAX_THUMBNAILS:         # spread over the run
            thumbs = [thumbs[i] for i in thumbnail_picks(len(thumbs))]
        for j, (rect, image) in enumerate(thumbs):
            scene.add_geometry(_thumbnail(rect, image), geom_name=f"thumbnail_{j:06d}", node_name=f"thumbnail_{j:06d}")
    if not scene.geometry:
        raise OutputError("GLB export: nothing to write (no points and fewer than two cameras)")
    data = scene.export(file_type="glb")
    with atomic_open(path, "wb") as f:
        f.write(data)
    return {"points": int(len(pts)), "cameras": int(len(centres)), "file": str(path)}
