"""A browser view of a session (viser): what `reconstudio serve SESSION|--live` shows, so a run on a
headless GPU machine can be watched live and reviewed from a laptop.

`SessionView(server, folder)` puts a session into a `viser.ViserServer`: each stored frame's
points (back-projected at `stride`, at least `conf_threshold` confident, at most
`max_points_per_frame`, the session's edits applied exactly as the exports apply them:
engine/io/session_reader.py), the keyframes' camera frustums (with a small thumbnail), the
trajectory, and a timeline slider (frames up to N; "Follow newest" keeps it at the end while a run
grows). `update()` adds what the store holds since the last call and re-sends a frame whose
re-alignment changed; `reconstudio serve --live` calls it every second. The folder is held
(engine/io/lease.py) while it is served, so retention leaves it alone.

World up is -y (OpenCV camera axes, as the desktop viewer); frustums use viser's OpenCV camera
convention (+z forward, +y down). viser is an optional dependency (`pip install reconstudio[share]`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Union

import numpy as np

from .api import EngineError
from .geometry import backproject, image_at

FRUSTUM_FRACTION = 0.08          # drawn frustum depth, as a fraction of the scene's median depth
THUMB_WIDTH = 96


def _wxyz(R: np.ndarray) -> np.ndarray:
    from scipy.spatial.transform import Rotation
    x, y, z, w = Rotation.from_matrix(np.asarray(R, np.float64)).as_quat()
    return np.array([w, x, y, z])


class SessionView:
    """See the module docstring."""

    def __init__(self, server, folder: Union[str, Path], stride: int = 4, conf_threshold: float = 0.0,
                 max_points_per_frame: int = 20_000, point_size: Optional[float] = None):
        from .io.lease import hold_session
        from .io.store import session_folder

        self.server = server
        self.folder = session_folder(folder)
        self._lease = hold_session(self.folder, role="serve")
        self.stride = max(1, int(stride))
        self.conf_threshold = float(conf_threshold)
        self.max_points_per_frame = int(max_points_per_frame)
        self.point_size = point_size
        self.frames: dict[int, object] = {}          # frame index -> point cloud handle
        self.points: dict[int, int] = {}             # frame index -> points sent
        self.cameras: dict[int, object] = {}         # keyframe index -> frustum handle
        self._placed: dict[int, Optional[bytes]] = {}   # frame index -> the placement it was sent with
        self._frustum_scale: Optional[float] = None
        self.centres: dict[int, np.ndarray] = {}
        self.problems: list[str] = []
        server.scene.set_up_direction("-y")
        self.slider = server.gui.add_slider("Frame", min=0, max=1, step=1, initial_value=1, disabled=True)
        self.follow = server.gui.add_checkbox("Follow newest", True)
        self.info = server.gui.add_markdown("")
        self.slider.on_update(lambda _: self._apply_timeline())
        self.follow.on_update(lambda _: self._apply_timeline())

    def close(self) -> None:
        self._lease.release()

    @property
    def indices(self) -> list[int]:
        return sorted(self.frames)

    def update(self) -> int:
        """Send the frames stored since the last call (and those whose placement changed);
        returns how many were sent."""
        from .io.edits import EditsError
        from .io.session_reader import read_session

        try:
            reader = read_session(self.folder)
        except EditsError as exc:         # a bad edits file: the raw session, said once
            if str(exc) not in self.problems:
                self.problems.append(str(exc))
            reader = read_session(self.folder, edits=None)
        sent = 0
        S = reader.edits.similarity() if reader.edits is not None else None
        edits_key = repr(reader.edits.to_dict()) if reader.edits is not None else ""
        for pose in reader.poses:
            key = (edits_key + repr(None if pose.transform is None else pose.transform.round(9).tolist())).encode()
            if self._placed.get(pose.index) == key:
                continue
            try:
                r = reader.frame(pose)
            except EngineError as exc:    # a damaged frame file: said once, tried again next time
                if str(exc) not in self.problems:
                    self.problems.append(str(exc))
                continue
            self._send(r)
            self._placed[pose.index] = key
            sent += 1
        if sent:
            self._send_trajectory()
            n = len(self.frames)
            lo, hi = (min(self.frames), max(self.frames)) if n else (0, 1)
            self.slider.min, self.slider.max = lo, max(hi, lo + 1)
            self.slider.disabled = n < 2
            if self.follow.value:
                self.slider.value = hi
            unit = "m" if S is not None and reader.edits.scale is not None else "scene units"
            self.info.content = (f"**{self.folder.name}**: {n} frames, "
                                 f"{sum(self.points.values()):,} points ({unit})")
            self._apply_timeline()
        return sent

    def _send(self, r) -> None:
        i = int(r.index)
        name = f"/frames/{i:06d}"
        if r.depth is not None:
            h, w = np.shape(r.depth)
            conf = r.conf if r.conf is not None else None
            pts, mask = backproject(r.depth, r.K, r.c2w, self.stride, conf,
                                    self.conf_threshold if conf is not None else -math.inf)
            cols = image_at(np.asarray(r.image), h, w)[mask].astype(np.uint8) if np.size(r.image) else \
                np.full((len(pts), 3), 200, np.uint8)
            if len(pts) > self.max_points_per_frame:
                step = -(-len(pts) // self.max_points_per_frame)
                pts, cols = pts[::step], cols[::step]
            if self._frustum_scale is None and mask.any():
                self._frustum_scale = FRUSTUM_FRACTION * float(np.median(np.asarray(r.depth)[mask]))
            size = self.point_size or 0.004 * (self._frustum_scale or 1.0) / FRUSTUM_FRACTION
            self.frames[i] = self.server.scene.add_point_cloud(name, points=pts.astype(np.float32), colors=cols,
                                                               point_size=size, precision="float32")
            self.points[i] = len(pts)
        else:
            self.frames[i] = self.server.scene.add_point_cloud(name, points=np.zeros((0, 3), np.float32),
                                                               colors=(200, 200, 200))
            self.points[i] = 0
        c2w = np.asarray(r.c2w, np.float64)
        self.centres[i] = c2w[:3, 3].copy()
        if r.is_keyframe:
            img = np.asarray(r.image)
            ih, iw = np.shape(r.depth) if r.depth is not None else img.shape[:2]   # the size K is for
            fov = 2.0 * math.atan2(ih / 2.0, float(np.asarray(r.K, np.float64)[1, 1]))
            step = max(1, img.shape[1] // THUMB_WIDTH) if img.size else 1
            thumb = np.ascontiguousarray(img[::step, ::step]) if img.size else None
            self.cameras[i] = self.server.scene.add_camera_frustum(
                f"/cameras/{i:06d}", fov=fov, aspect=iw / max(ih, 1), scale=self._frustum_scale or 0.1,
                color=(90, 170, 255), image=thumb, wxyz=_wxyz(c2w[:3, :3]), position=c2w[:3, 3])

    def _send_trajectory(self) -> None:
        idx = sorted(self.centres)
        if len(idx) < 2:
            return
        c = np.array([self.centres[i] for i in idx], np.float32)
        seg = np.stack([c[:-1], c[1:]], 1)
        self.server.scene.add_line_segments("/trajectory", points=seg, colors=(255, 120, 40),
                                            thickness=2.0, thickness_units="screen")

    def _apply_timeline(self) -> None:
        """Frames (points and cameras) up to the slider's frame are visible."""
        n = self.slider.value
        for i, h in self.frames.items():
            h.visible = i <= n
        for i, h in self.cameras.items():
            h.visible = i <= n

    def visible_frames(self) -> list[int]:
        return [i for i, h in sorted(self.frames.items()) if h.visible]


def newest_session(root: Union[str, Path, None] = None) -> Optional[Path]:
    """The most recently written session folder under `root` (default: the sessions folder)."""
    from .io.retention import list_sessions
    entries = list_sessions(root)
    return entries[-1].folder if entries else None
