"""Binary little-endian PLY point clouds written a batch at a time (the PLY export, the
nerfstudio folder's sparse_pc.ply): x y z float32, red green blue uint8, confidence float32."""
from __future__ import annotations

import contextlib

import numpy as np

from .atomic import atomic_open

PLY_VERTEX_DTYPE = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"),
                             ("red", "u1"), ("green", "u1"), ("blue", "u1"),
                             ("confidence", "<f4")])


def _ply_header(n: int, pad_to: int = 0) -> bytes:
    """The PLY header of n vertices of PLY_VERTEX_DTYPE, padded by a comment to `pad_to` bytes
    (the count is written last, over the same number of header bytes)."""
    props = "".join(f"property {t} {name}\n" for name, t in
                    (("x", "float"), ("y", "float"), ("z", "float"), ("red", "uchar"),
                     ("green", "uchar"), ("blue", "uchar"), ("confidence", "float")))
    head = ("ply\nformat binary_little_endian 1.0\n"
            "comment ReconStudio point cloud (camera-to-world, OpenCV axes)\n")
    tail = f"element vertex {int(n)}\n{props}end_header\n"
    if pad_to:
        fill = pad_to - len(head) - len(tail) - len("comment \n")
        head += "comment " + " " * max(0, fill) + "\n"
    return (head + tail).encode("ascii")


PLY_MAX_DIGITS = 20       # room the header keeps for the vertex count


def _ply_vertices(points, colors, conf) -> np.ndarray:
    n = len(points)
    vertex = np.empty(n, dtype=PLY_VERTEX_DTYPE)
    points = np.asarray(points, np.float32).reshape(-1, 3)
    vertex["x"], vertex["y"], vertex["z"] = points[:, 0], points[:, 1], points[:, 2]
    colors = np.clip(np.asarray(colors).reshape(-1, 3), 0, 255).astype(np.uint8)
    vertex["red"], vertex["green"], vertex["blue"] = colors[:, 0], colors[:, 1], colors[:, 2]
    vertex["confidence"] = np.asarray(conf, np.float32).reshape(-1)
    return vertex


@contextlib.contextmanager
def ply_writer(path):
    """`with ply_writer(p) as add: add(points, colors, conf)...`: a binary PLY written a batch at
    a time, atomically; the vertex count goes into the header at the end."""
    size = len(_ply_header(10 ** PLY_MAX_DIGITS - 1, 0)) + len("comment \n") + 1
    n = 0

    def add(pts, cols, conf=None):
        nonlocal n
        if len(pts):
            f.write(_ply_vertices(pts, cols, np.ones(len(pts), np.float32) if conf is None else conf).tobytes())
            n += len(pts)
    with atomic_open(path, "wb") as f:
        f.write(_ply_header(0, size))
        yield add
        f.seek(0)
        f.write(_ply_header(n, size))
