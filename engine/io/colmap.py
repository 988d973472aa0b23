"""COLMAP text model export (the layout COLMAP, pycolmap, nerfstudio and gsplat read).

    DIR/images/NNNNNN.jpg           the colour image of every registered frame (result resolution)
    DIR/sparse/0/cameras.txt        one PINHOLE camera per distinct (size, intrinsics)
    DIR/sparse/0/images.txt         per frame: world-to-camera pose + its 2D observations
    DIR/sparse/0/points3D.txt       the exported points, each with its one-observation track
    DIR/sparse/0/*.bin              the same model in COLMAP's binary layout (binary=True, default):
                                    some readers take only one of the two (nerfstudio's
                                    colmap_to_json reads .bin; its data parser and gsplat either)

COLMAP conventions (https://colmap.github.io/format.html), all handled here:
- images.txt holds WORLD-TO-CAMERA poses: `QW QX QY QZ TX TY TZ` (scalar-first quaternion) with
  x_cam = R x_world + t; our results are camera-to-world, so R = R_c2w^T, t = -R^T c.
- Camera axes are OpenCV's (x right, y down, z forward), the same as ours.
- Image coordinates put the CENTRE of the top-left pixel at (0.5, 0.5); OpenCV's K puts it at
  (0, 0), so the principal point and every 2D observation are shifted by +0.5.
- Ids are 1-based; a point's track is (IMAGE_ID, POINT2D_IDX) with a 0-based index into that
  image's observation list; an observation without a 3D point would carry POINT3D_ID -1.

Every file is written atomically; images are JPEG (quality 95) by default, PNG on request.
`frames` may be a generator: one frame's image is held at a time (the model's records, the size
of the output, are kept until the end). The six sparse/0 files are committed together at the
end, after every image: an export stopped midway (an exception, Ctrl-C) removes the images it
added and leaves any earlier model in the folder as it was.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence, Union

import numpy as np

from .atomic import OutputError, atomic_open

PathLike = Union[str, Path]


def w2c_qvec_tvec(c2w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COLMAP's (qvec [qw qx qy qz], tvec) of a camera-to-world 4x4 pose."""
    from scipy.spatial.transform import Rotation

    c2w = np.asarray(c2w, np.float64)
    R = c2w[:3, :3].T
    t = -R @ c2w[:3, 3]
    x, y, z, w = Rotation.from_matrix(R).as_quat()
    q = np.array([w, x, y, z])
    return (q if q[0] >= 0 else -q), t


def _encode(image: np.ndarray, ext: str) -> bytes:
    import cv2

    bgr = cv2.cvtColor(np.ascontiguousarray(image, np.uint8), cv2.COLOR_RGB2BGR)
    params = [cv2.IMWRITE_JPEG_QUALITY, 95] if ext == ".jpg" else []
    ok, buf = cv2.imencode(ext, bgr, params)
    if not ok:
        raise OutputError(f"could not encode an image as {ext}")
    return buf.tobytes()


def export_colmap(folder: PathLike, frames: Sequence, image_format: str = "jpg", binary: bool = True) -> dict:
    """Write a COLMAP text model into `folder` (created if needed).

    `frames`: per registered image, a dict with `index` (frame number, names the image file),
    `c2w` 4x4, `K` 3x3 for `image`, `image` h x w x 3 uint8 RGB, and optionally `points` [M,3],
    `colors` [M,3] uint8, `uv` [M,2] (OpenCV pixel coordinates of each point in this image) and
    `error` [M] (written as the reprojection-error column). Returns
    {"images": N, "cameras": C, "points": P, "folder": str}.
    """
    ext = "." + image_format.lower().lstrip(".").replace("jpeg", "jpg")
    if ext not in (".jpg", ".png"):
        raise OutputError(f"COLMAP export: image format must be jpg or png, got {image_format!r}")
    folder = Path(folder).expanduser()
    sparse, images_dir = folder / "sparse" / "0", folder / "images"
    try:
        sparse.mkdir(parents=True, exist_ok=True)
        images_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"COLMAP export: cannot create {folder}: {exc.strerror or exc}") from None

    added: list = []                                  # images this export created
    try:
        return _write_model(frames, ext, sparse, images_dir, binary, added, folder)
    except BaseException:
        for p in added:
            with contextlib.suppress(OSError):
                p.unlink()
        raise


def _write_model(frames, ext, sparse, images_dir, binary, added, folder) -> dict:
    cameras: dict[tuple, int] = {}
    cam_lines, img_lines, pt_lines = [], [], []
    bin_cams, bin_imgs, bin_pts = [], [], []          # the same records for the binary files
    next_point = 1
    n_points = 0
    for image_id, f in enumerate(frames, 1):
        img = np.asarray(f["image"], np.uint8)
        h, w = img.shape[:2]
        K = np.asarray(f["K"], np.float64)
        params = (K[0, 0], K[1, 1], K[0, 2] + 0.5, K[1, 2] + 0.5)
        key = (w, h) + tuple(round(p, 6) for p in params)
        if key not in cameras:
            cameras[key] = len(cameras) + 1
            cam_lines.append(f"{cameras[key]} PINHOLE {w} {h} " + " ".join(f"{p:.9g}" for p in params))
            bin_cams.append((cameras[key], w, h, params))
        cam_id = cameras[key]
        name = f"{int(f['index']):06d}{ext}"
        if not (images_dir / name).exists():
            added.append(images_dir / name)
        with atomic_open(images_dir / name, "wb") as fh:
            fh.write(_encode(img, ext))
        q, t = w2c_qvec_tvec(f["c2w"])
        img_lines.append(f"{image_id} " + " ".join(f"{v:.12g}" for v in (*q, *t)) + f" {cam_id} {name}")

        pts = f.get("points")
        m = 0 if pts is None else len(pts)
        uv_bin = np.zeros((0, 2))
        ids_bin = np.zeros(0, np.int64)
        if m:
            pts = np.asarray(pts, np.float64).reshape(-1, 3)
            cols = np.asarray(f["colors"], np.uint8).reshape(-1, 3)
            uv = np.asarray(f["uv"], np.float64).reshape(-1, 2) + 0.5
            err = np.asarray(f.get("error", np.zeros(m)), np.float64).reshape(-1)
            ids = np.arange(next_point, next_point + m)
            uv_bin, ids_bin = uv, ids
            bin_pts.append((ids, pts, cols, err, image_id))
            # line 2 of the image: "X Y POINT3D_ID" per observation (one % over the whole frame:
            # cheaper than a format call per point)
            obs = np.column_stack([uv, ids]).ravel().tolist()
            img_lines.append((("%.2f %.2f %d " * m) % tuple(obs)).rstrip())
            rows = np.column_stack([ids, pts, cols, err, np.full(m, image_id), np.arange(m)]).ravel().tolist()
            pt_lines.append(("%d %.7g %.7g %.7g %d %d %d %.4g %d %d\n" * m) % tuple(rows))
            next_point += m
            n_points += m
        else:
            img_lines.append("")
        bin_imgs.append((image_id, q, t, cam_id, name, uv_bin, ids_bin))

    header = "# ReconStudio export (camera poses world-to-camera, OpenCV axes)\n"
    with contextlib.ExitStack() as commit:     # every sparse file renamed into place at the end
        fh = commit.enter_context(atomic_open(sparse / "cameras.txt", "w"))
        fh.write(header + "# CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n"
                 f"# Number of cameras: {len(cam_lines)}\n" + "".join(l + "\n" for l in cam_lines))
        fh = commit.enter_context(atomic_open(sparse / "images.txt", "w"))
        n_img = len(img_lines) // 2
        fh.write(header + "# IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n"
                 "# POINTS2D[] as (X, Y, POINT3D_ID)\n"
                 f"# Number of images: {n_img}, mean observations per image: "
                 f"{n_points / max(n_img, 1):.1f}\n" + "".join(l + "\n" for l in img_lines))
        fh = commit.enter_context(atomic_open(sparse / "points3D.txt", "w"))
        fh.write(header + "# POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)\n"
                 f"# Number of points: {n_points}, mean track length: 1\n")
        for chunk in pt_lines:                 # one string per frame, lines end in "\n"
            fh.write(chunk)
        if binary:
            _write_binary(sparse, bin_cams, bin_imgs, bin_pts, commit)
    return {"images": len(img_lines) // 2, "cameras": len(cam_lines), "points": n_points,
            "folder": str(folder)}


PINHOLE_MODEL_ID = 1


def _write_binary(sparse: Path, cams, imgs, pts, commit: contextlib.ExitStack) -> None:
    """cameras.bin / images.bin / points3D.bin (little-endian, COLMAP's read_write_model layout):
    cameras: u64 n, then per camera i32 id, i32 model, u64 width, u64 height, f64 params[4];
    images: u64 n, then i32 id, f64 qvec[4], f64 tvec[3], i32 camera, name + NUL, u64 n2d,
    (f64 x, f64 y, i64 point3D_id) per observation; points3D: u64 n, then u64 id, f64 xyz[3],
    u8 rgb[3], f64 error, u64 track length, (i32 image, i32 point2D_idx) per track element."""
    f = commit.enter_context(atomic_open(sparse / "cameras.bin", "wb"))
    f.write(np.uint64(len(cams)).tobytes())
    rec = np.dtype([("id", "<i4"), ("model", "<i4"), ("w", "<u8"), ("h", "<u8"), ("p", "<f8", 4)])
    a = np.zeros(len(cams), rec)
    for i, (cid, w, h, params) in enumerate(cams):
        a[i] = (cid, PINHOLE_MODEL_ID, w, h, params)
    f.write(a.tobytes())
    f = commit.enter_context(atomic_open(sparse / "images.bin", "wb"))
    f.write(np.uint64(len(imgs)).tobytes())
    head = np.dtype([("id", "<i4"), ("q", "<f8", 4), ("t", "<f8", 3), ("cam", "<i4")])
    obs = np.dtype([("x", "<f8"), ("y", "<f8"), ("pid", "<i8")])
    for image_id, q, t, cam_id, name, uv, ids in imgs:
        h = np.zeros(1, head)
        h[0] = (image_id, q, t, cam_id)
        f.write(h.tobytes())
        f.write(name.encode("utf-8") + b"\0")
        f.write(np.uint64(len(ids)).tobytes())
        o = np.zeros(len(ids), obs)
        if len(ids):
            o["x"], o["y"], o["pid"] = uv[:, 0], uv[:, 1], ids
        f.write(o.tobytes())
    f = commit.enter_context(atomic_open(sparse / "points3D.bin", "wb"))
    f.write(np.uint64(sum(len(p[0]) for p in pts)).tobytes())
    rec = np.dtype([("id", "<u8"), ("xyz", "<f8", 3), ("rgb", "u1", 3), ("err", "<f8"), ("n", "<u8"),
                    ("img", "<i4"), ("idx", "<i4")])          # every track has one element
    for ids, xyz, rgb, err, image_id in pts:
        a = np.zeros(len(ids), rec)
        a["id"], a["xyz"], a["rgb"], a["err"], a["n"] = ids, xyz, rgb, err, 1
        a["img"], a["idx"] = image_id, np.arange(len(ids))
        f.write(a.tobytes())
