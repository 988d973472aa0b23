"""COLMAP model export (the layout COLMAP, pycolmap, nerfstudio and gsplat read).

    DIR/images/NNNNNN.jpg           the colour image of every registered frame (result resolution)
    DIR/sparse/0/cameras.txt        one PINHOLE camera per distinct (size, intrinsics)
    DIR/sparse/0/images.txt         per frame: world-to-camera pose + its 2D observations
    DIR/sparse/0/points3D.txt       the exported points, each with its track
    DIR/sparse/0/*.bin              the same model in COLMAP's binary layout (binary=True, default):
                                    some readers take only one of the two (nerfstudio's
                                    colmap_to_json reads .bin; its data parser and gsplat either)

Tracks: every exported point is observed in the frame it comes from (its pixel) and in the other
frames that see it (engine.io.tracks: it projects into the image and agrees with that frame's
depth within a tolerance), among the frames within COVISIBILITY_FRAMES exported frames of its own.
A point no other frame sees is left out (COLMAP models hold
triangulated points, tracks of two or more; its bundle adjuster refuses shorter ones). An
observation is the point's projection, so the model starts at zero reprojection error and a
bundle adjuster (pycolmap.bundle_adjustment) refines it from there. To keep the model's size a
small multiple of the points', a point gets on average at most TRACK_EXTRA observations besides
its own: of the points a frame sees from another, every m-th (by point id, shifted per image)
is kept, m = frames in the window / TRACK_EXTRA. The headers' counts are computed from what
was written.

COLMAP conventions (https://colmap.github.io/format.html), all handled here:
- images.txt holds WORLD-TO-CAMERA poses: `QW QX QY QZ TX TY TZ` (scalar-first quaternion) with
  x_cam = R x_world + t; our results are camera-to-world, so R = R_c2w^T, t = -R^T c.
- Camera axes are OpenCV's (x right, y down, z forward), the same as ours.
- Image coordinates put the CENTRE of the top-left pixel at (0.5, 0.5); OpenCV's K puts it at
  (0, 0), so the principal point and every 2D observation are shifted by +0.5.
- Ids are 1-based (point ids keep the exported points' order, with gaps where a point seen by
  one frame only was left out); a point's track is (IMAGE_ID, POINT2D_IDX) with a 0-based index
  into that image's observation list.

Memory: `frames` is a generator read once; the writer keeps the frames of twice the
co-visibility window (their points, poses and a per-cell depth map of a few KB, never an image or
a depth map)
and streams every finished image and point record to temp files beside the model (an image is
finished once the window has passed it). The six sparse/0 files are committed together at the
end, after every image, each as its header (counts known only then) + its body: an export stopped
midway (an exception, Ctrl-C) removes the images it added and the temp files, and leaves any
earlier model in the folder as it was. Images are JPEG (quality 95) by default, PNG on request.
"""
from __future__ import annotations

import collections
import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from .atomic import TMP_SUFFIX, OutputError, atomic_open
from .tracks import DEPTH_TOLERANCE, View, visible

PathLike = Union[str, Path]

COVISIBILITY_FRAMES = 64     # a point is looked for in the exported frames this close to its own
TRACK_EXTRA = 8              # observations per point besides its own, on average at most
PINHOLE_MODEL_ID = 1
_SPREAD = 7919               # a prime: shifts the kept subset of points from one image to the next


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


def export_colmap(folder: PathLike, frames: Iterable, image_format: str = "jpg", binary: bool = True,
                  n_frames: Optional[int] = None, window: int = COVISIBILITY_FRAMES,
                  tolerance: float = DEPTH_TOLERANCE) -> dict:
    """Write a COLMAP model into `folder` (created if needed).

    `frames`: per registered image, in trajectory order, a dict with `index` (frame number,
    names the image file), `c2w` 4x4, `K` 3x3 for `image`, `image` h x w x 3 uint8 RGB, and
    optionally `points` [M,3] (world), `colors` [M,3] uint8, `uv` [M,2] (OpenCV pixel coordinates
    of each point in this image), `depth` (the frame's depth map, any size, with `depth_K` its
    intrinsics; used to decide which points of other frames it sees) and `stride` (the pixel
    step the points were taken at). `n_frames`: how many frames there are, when known (sets the
    thinning of the tracks; default: a full window). Returns {"images", "cameras", "points",
    "observations", "mean_track_length", "folder"}.
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
    writer = _ModelWriter(sparse, binary)
    try:
        out = _write_model(frames, ext, images_dir, writer, added, n_frames, int(window), tolerance)
        writer.commit()
    except BaseException:
        for p in added:
            with contextlib.suppress(OSError):
                p.unlink()
        raise
    finally:
        writer.close()
    out["folder"] = str(folder)
    return out


class _Frame:
    """One frame in the co-visibility window: its view, its points (as host) and what it has
    collected so far (observations as observer, track elements of its points)."""

    def __init__(self, pos, image_id, name, q, t, cam_id, view, pts, cols, ids):
        self.pos, self.image_id, self.name, self.q, self.t, self.cam_id = pos, image_id, name, q, t, cam_id
        self.view, self.pts, self.cols, self.ids = view, pts, cols, ids
        self.obs_uv: list = []
        self.obs_pid: list = []
        self.n_obs = 0
        self.tracks: list = []          # (point indices in self.pts, image_id, point2D indices)
        self.own_uv = np.zeros((0, 2))  # the pixel of each of its points

    def observe(self, uv: np.ndarray, pid: np.ndarray) -> np.ndarray:
        """Append observations; returns their POINT2D_IDX in this image."""
        idx = np.arange(self.n_obs, self.n_obs + len(pid))
        self.obs_uv.append(np.asarray(uv, np.float64))
        self.obs_pid.append(np.asarray(pid, np.int64))
        self.n_obs += len(pid)
        return idx


def _write_model(frames, ext, images_dir, writer, added, n_frames, window, tol) -> dict:
    """Frames stream in; frame j observes the points of every frame within `window` of it once
    frame j + window has arrived (one `visible` call for all of them, so the z-buffer holds
    every nearby frame's points), and is finished (its image record and the points it hosts
    written) once frame j + 2 window has: no observer of its points is left then."""
    cameras: dict[tuple, int] = {}
    win: collections.deque = collections.deque()      # frames pos - 2 window .. pos
    pairs = 2 * window if n_frames is None else max(1, min(2 * window, int(n_frames) - 1))
    every = max(1, int(round(pairs / TRACK_EXTRA)))
    next_point = 1

    def observe(obs: _Frame):
        hosts = [hf for hf in win if hf is not obs and abs(hf.pos - obs.pos) <= window and len(hf.ids)]
        start = 0
        while start < len(hosts):       # batches of about BATCH_POINTS points bound the memory
            group, n = [], 0
            while start < len(hosts) and (not group or n + len(hosts[start].ids) <= BATCH_POINTS):
                group.append(hosts[start])
                n += len(hosts[start].ids)
                start += 1
            pts = np.concatenate([hf.pts for hf in group])
            ids = np.concatenate([hf.ids for hf in group])
            owner = np.repeat(np.arange(len(group)), [len(hf.ids) for hf in group])
            idx, uv = visible(pts, obs.view, tol)
            keep = (ids[idx] + _SPREAD * obs.image_id) % every == 0
            idx, uv = idx[keep], uv[keep]
            if not len(idx):
                continue
            p2d = obs.observe(uv, ids[idx])
            first = np.concatenate([[0], np.cumsum([len(hf.ids) for hf in group])[:-1]])
            for k in np.unique(owner[idx]):
                sel = owner[idx] == k
                group[k].tracks.append((idx[sel] - first[k], obs.image_id, p2d[sel]))

    pos = -1
    for pos, f in enumerate(frames):
        image_id = pos + 1
        img = np.asarray(f["image"], np.uint8)
        h, w = img.shape[:2]
        K = np.asarray(f["K"], np.float64)
        params = (K[0, 0], K[1, 1], K[0, 2] + 0.5, K[1, 2] + 0.5)
        key = (w, h) + tuple(round(p, 6) for p in params)
        if key not in cameras:
            cameras[key] = len(cameras) + 1
            writer.camera(cameras[key], w, h, params)
        name = f"{int(f['index']):06d}{ext}"
        if not (images_dir / name).exists():
            added.append(images_dir / name)
        with atomic_open(images_dir / name, "wb") as fh:
            fh.write(_encode(img, ext))
        q, t = w2c_qvec_tvec(f["c2w"])
        depth = f.get("depth")
        view = (View.of(f["c2w"], f.get("depth_K", K), depth, (h, w), int(f.get("stride", 1)))
                if depth is not None else View.of(f["c2w"], K, None, (h, w), int(f.get("stride", 1))))
        pts = f.get("points")
        m = 0 if pts is None else len(pts)
        if m:
            pts = np.asarray(pts, np.float64).reshape(-1, 3)
            cols = np.asarray(f["colors"], np.uint8).reshape(-1, 3)
            ids = np.arange(next_point, next_point + m, dtype=np.int64)
            next_point += m
        else:
            pts, cols, ids = np.zeros((0, 3)), np.zeros((0, 3), np.uint8), np.zeros(0, np.int64)
        cur = _Frame(pos, image_id, name, q, t, cameras[key], view, pts, cols, ids)
        if m:   # its own pixels: observed when the point is finished (if another frame sees it)
            cur.own_uv = np.asarray(f["uv"], np.float64).reshape(-1, 2)
        win.append(cur)
        if pos - window >= 0:                # its neighbours on both sides have arrived
            observe(win[len(win) - 1 - window])
        while win[0].pos <= pos - 2 * window:   # every observer of its points is done
            writer.finish(win.popleft())
    for obs in list(win):                    # the last frames: their neighbours are all here
        if obs.pos > pos - window:
            observe(obs)
    while win:
        writer.finish(win.popleft())
    return writer.summary(len(cameras))


BATCH_POINTS = 1_000_000     # points projected into a frame in one call (its z-buffer's reach)


class _Body:
    """A file's body streamed to a temp file beside it; committed as header + body."""

    def __init__(self, final: Path, text: bool):
        fd, self.tmp = tempfile.mkstemp(prefix=f".{final.name}.{os.getpid()}-", suffix=TMP_SUFFIX,
                                        dir=final.parent)
        self.f = os.fdopen(fd, "w+b")
        self.final, self.text = final, text

    def write(self, data) -> None:
        self.f.write(data.encode("utf-8") if self.text else data)

    def commit(self, head, stack: contextlib.ExitStack) -> None:
        out = stack.enter_context(atomic_open(self.final, "wb"))
        out.write(head.encode("utf-8") if self.text else head)
        self.f.flush()
        self.f.seek(0)
        shutil.copyfileobj(self.f, out, 1 << 22)

    def close(self) -> None:
        self.f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


_HEAD = np.dtype([("id", "<i4"), ("q", "<f8", 4), ("t", "<f8", 3), ("cam", "<i4")])
_OBS = np.dtype([("x", "<f8"), ("y", "<f8"), ("pid", "<i8")])
_CAM = np.dtype([("id", "<i4"), ("model", "<i4"), ("w", "<u8"), ("h", "<u8"), ("p", "<f8", 4)])
_POINT = np.dtype([("id", "<u8"), ("xyz", "<f8", 3), ("rgb", "u1", 3), ("err", "<f8"), ("n", "<u8")])


class _ModelWriter:
    """The six sparse/0 files, written as records finish (binary layout as COLMAP's
    read_write_model: cameras: u64 n, then i32 id, i32 model, u64 width, u64 height, f64
    params[4]; images: u64 n, then i32 id, f64 qvec[4], f64 tvec[3], i32 camera, name + NUL,
    u64 n2d, (f64 x, f64 y, i64 point3D_id) each; points3D: u64 n, then u64 id, f64 xyz[3],
    u8 rgb[3], f64 error, u64 track length, (i32 image, i32 point2D_idx) each)."""

    def __init__(self, sparse: Path, binary: bool):
        self.sparse, self.binary = sparse, binary
        self.cams: list = []
        self.bodies: dict = {}
        self.n_images = self.n_points = self.n_obs = 0
        try:
            for name in ("images.txt", "points3D.txt") + (("images.bin", "points3D.bin") if binary else ()):
                self.bodies[name] = _Body(sparse / name, name.endswith(".txt"))
        except OSError as exc:
            self.close()
            raise OutputError(f"COLMAP export: cannot write into {sparse}: {exc.strerror or exc}") from None

    def camera(self, cid: int, w: int, h: int, params) -> None:
        self.cams.append((cid, w, h, params))

    def finish(self, fr: _Frame) -> None:
        """Write the image record of `fr` and the points it hosts (both complete now). A point
        no other frame saw is left out (a COLMAP model holds triangulated points: a track of
        two or more); the others get their own pixel as an observation, last in the image."""
        m = len(fr.ids)
        if m:
            seen = np.zeros(m, bool)
            for t in fr.tracks:
                seen[t[0]] = True
            keep = np.nonzero(seen)[0]
            fr.tracks.append((keep, fr.image_id, fr.observe(fr.own_uv[keep], fr.ids[keep])))
        uv = np.concatenate(fr.obs_uv) if fr.obs_uv else np.zeros((0, 2))
        pid = np.concatenate(fr.obs_pid) if fr.obs_pid else np.zeros(0, np.int64)
        xy = uv + 0.5                                  # COLMAP pixel centres
        b = self.bodies
        b["images.txt"].write(f"{fr.image_id} " + " ".join(f"{v:.12g}" for v in (*fr.q, *fr.t))
                              + f" {fr.cam_id} {fr.name}\n"
                              + (("%.3f %.3f %d " * len(pid)) % tuple(np.column_stack([xy, pid]).ravel().tolist())
                                 ).rstrip() + "\n")
        if self.binary:
            head = np.zeros(1, _HEAD)
            head[0] = (fr.image_id, fr.q, fr.t, fr.cam_id)
            o = np.zeros(len(pid), _OBS)
            o["x"], o["y"], o["pid"] = xy[:, 0], xy[:, 1], pid
            b["images.bin"].write(head.tobytes() + fr.name.encode("utf-8") + b"\0"
                                  + np.uint64(len(pid)).tobytes() + o.tobytes())
        self.n_images += 1
        if m:
            self._points(fr, keep)
        fr.obs_uv = fr.obs_pid = fr.tracks = None

    def _points(self, fr: _Frame, keep: np.ndarray) -> None:
        """The points3D records of fr's points `keep` (sorted indices; every track element of
        fr.tracks refers to one of them)."""
        m = len(keep)
        if not m:
            return
        remap = np.full(len(fr.ids), -1, np.int64)
        remap[keep] = np.arange(m)
        local = remap[np.concatenate([t[0] for t in fr.tracks])]
        img = np.concatenate([np.full(len(t[0]), t[1], np.int64) for t in fr.tracks])
        p2d = np.concatenate([t[2] for t in fr.tracks])
        order = np.argsort(local, kind="stable")
        local, img, p2d = local[order], img[order], p2d[order]
        counts = np.bincount(local, minlength=m)
        n = len(local)
        # points3D.txt: "ID X Y Z R G B ERROR (IMAGE_ID POINT2D_IDX)..." -- the error column is the
        # reprojection error of the track: 0, observations are the point's projections
        heads = (("%d %.9g %.9g %.9g %d %d %d 0" + "\n") * m % tuple(
            np.column_stack([fr.ids[keep], fr.pts[keep], fr.cols[keep]]).ravel().tolist())).split("\n")[:-1]
        pairs = ((" %d %d" * n) % tuple(np.column_stack([img, p2d]).ravel().tolist())).split(" ")[1:]
        ends = np.cumsum(counts) * 2
        starts = ends - 2 * counts
        self.bodies["points3D.txt"].write("".join(
            heads[i] + " " + " ".join(pairs[starts[i]:ends[i]]) + "\n" for i in range(m)))
        if self.binary:
            rec = np.zeros(m, _POINT)
            rec["id"], rec["xyz"], rec["rgb"], rec["n"] = fr.ids[keep], fr.pts[keep], fr.cols[keep], counts
            tr = np.empty((n, 2), "<i4")
            tr[:, 0], tr[:, 1] = img, p2d
            hb = rec.view(np.uint8).reshape(m, _POINT.itemsize)
            tb = tr.view(np.uint8).reshape(n, 8)
            # interleave: each point's header, then its track's 8-byte elements
            start = np.arange(m) * _POINT.itemsize + np.concatenate([[0], np.cumsum(counts)[:-1]]) * 8
            buf = np.empty(m * _POINT.itemsize + n * 8, np.uint8)
            buf[(start[:, None] + np.arange(_POINT.itemsize)).ravel()] = hb.ravel()
            rank = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
            tpos = np.repeat(start + _POINT.itemsize, counts) + rank * 8
            buf[(tpos[:, None] + np.arange(8)).ravel()] = tb.ravel()
            self.bodies["points3D.bin"].write(buf.tobytes())
        self.n_points += m
        self.n_obs += n

    def summary(self, n_cams: int) -> dict:
        return {"images": self.n_images, "cameras": n_cams, "points": self.n_points,
                "observations": self.n_obs,
                "mean_track_length": self.n_obs / self.n_points if self.n_points else 0.0}

    def commit(self) -> None:
        header = "# ReconStudio export (camera poses world-to-camera, OpenCV axes)\n"
        per_image = self.n_obs / max(self.n_images, 1)
        track = self.n_obs / self.n_points if self.n_points else 0.0
        with contextlib.ExitStack() as stack:      # every sparse file renamed into place at the end
            fh = stack.enter_context(atomic_open(self.sparse / "cameras.txt", "w"))
            fh.write(header + "# CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n"
                     f"# Number of cameras: {len(self.cams)}\n"
                     + "".join(f"{c} PINHOLE {w} {h} " + " ".join(f"{p:.9g}" for p in params) + "\n"
                               for c, w, h, params in self.cams))
            self.bodies["images.txt"].commit(
                header + "# IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n"
                "# POINTS2D[] as (X, Y, POINT3D_ID)\n"
                f"# Number of images: {self.n_images}, mean observations per image: {per_image:.1f}\n", stack)
            self.bodies["points3D.txt"].commit(
                header + "# POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)\n"
                f"# Number of points: {self.n_points}, mean track length: {track:.4f}\n", stack)
            if self.binary:
                fb = stack.enter_context(atomic_open(self.sparse / "cameras.bin", "wb"))
                a = np.zeros(len(self.cams), _CAM)
                for i, (cid, w, h, params) in enumerate(self.cams):
                    a[i] = (cid, PINHOLE_MODEL_ID, w, h, params)
                fb.write(np.uint64(len(self.cams)).tobytes() + a.tobytes())
                self.bodies["images.bin"].commit(np.uint64(self.n_images).tobytes(), stack)
                self.bodies["points3D.bin"].commit(np.uint64(self.n_points).tobytes(), stack)

    def close(self) -> None:
        for body in self.bodies.values():
            body.close()
