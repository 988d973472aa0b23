"""The review bar under the 3D view: scrub a live or finished session, camera presets, click
tools. The data work is Qt-free (engine.review, engine.geometry via ui.display); this module
only wires widgets to the viewer.

- Timeline: a slider over the stored frames. Moving it shows the session up to that frame —
  "Accumulated" (every point up to frame N) or "Current frame" (frame N's points; the cameras up
  to N stay) — read from the session store, so it works while a run is still writing. A frame
  without depth (engines that compute depth on keyframes only) has no points of its own: "Current
  frame" then shows the points of the nearest earlier frame with depth and says so beside the
  timeline, as the depth preview does. While
  reviewing a live run the view stops following it; "Live" returns to the whole session and
  follows the run again.
- Camera: Free (the user's), Follow (chase the newest camera), Top (look straight down on the scene).
- Click a camera -- anywhere on its drawn frustum or its thumbnail, or near its centre -- to show
  its frame and depth in the previews.
- Measure: click two points; the distance is shown in scene units (monocular engines: arbitrary
  scale, so it compares lengths within one run).
- Thumbnails: the newest keyframes' images drawn inside their frustums (read from the store).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Optional

import numpy as np
from PySide6 import QtCore, QtWidgets
from vispy import scene as vscene
from vispy.visuals.transforms import MatrixTransform

from engine.review import SessionTimeline, frames_up_to, pick_frustum, pick_nearest, place

from .display import FRUSTUM_FRACTION, make_display_frame

CAMERA_PRESETS = ("Free", "Follow", "Top")
CLICK_PX = 4          # a press and release closer than this is a click, not a drag
CAMERA_PICK_PX = 14   # around a camera's centre (a non-keyframe draws no frustum by default)
FRUSTUM_PICK_PX = 5   # around a drawn frustum's edges
DEPTH_LOOKBACK = 64   # stored frames searched back for the newest one with depth
POINT_PICK_PX = 8
MAX_THUMBNAILS = 48   # newest keyframes with an image in their frustum (one draw call each)
CACHE_POINTS = 4_000_000   # display packets kept for scrubbing (~28 bytes a point)
THUMB_WIDTH = 96


def project(viewer, world: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canvas pixel positions [N,2] and view depth [N] (homogeneous w; <= 0 = behind) of world
    points, through the viewer's current camera."""
    tr = viewer.view.scene.node_transform(viewer.canvas.scene)
    p = np.asarray(tr.map(np.asarray(world, np.float64).reshape(-1, 3)), np.float64)
    w = p[:, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        xy = p[:, :2] / w[:, None]
    return xy, w


class ReviewBar(QtWidgets.QWidget):
    """See the module docstring. `window` is the MainWindow (viewer, preview, stride, threshold)."""

    reviewChanged = QtCore.Signal(bool)       # True while the view shows a timeline position
    measured = QtCore.Signal(float)           # a distance was measured

    def __init__(self, window, parent=None):
        super().__init__(parent)
        self.window = window
        self.viewer = window.viewer
        self.timeline: Optional[SessionTimeline] = None
        self.reviewing = False
        self.shown_upto: Optional[int] = None     # timeline frame on screen (reviewing)
        self._shown_mode = None
        self._display_cache: "collections.OrderedDict" = collections.OrderedDict()   # LRU
        self._cached_points = 0
        self._frustum_depth: Optional[float] = None
        self._press = None
        self.measure_points: list[np.ndarray] = []
        self.distance: Optional[float] = None
        self.clicked_index: Optional[int] = None
        self.shown_keyframes = 0                  # keyframes among the frames on screen (reviewing)
        self.points_from: Optional[int] = None    # "Current frame": the frame whose points show
        self.click_handlers: list = []            # fn(pos) -> bool, before the built-in tools

        self.slider = QtWidgets.QSlider(QtCore.Qt.Orientation.Horizontal)
        self.slider.setRange(0, 0)
        self.slider.setEnabled(False)
        self.slider.setToolTip("Timeline: drag to show the session up to a frame (works during a run too)")
        self.frame_label = QtWidgets.QLabel("—")
        self.frame_label.setMinimumWidth(90)
        self.mode = QtWidgets.QComboBox()
        self.mode.addItems(["Accumulated", "Current frame"])
        self.mode.setToolTip("Points of every frame up to the timeline position, or of that frame only")
        self.live = QtWidgets.QPushButton("Live")
        self.live.setToolTip("Back to the whole session (and follow a running reconstruction)")
        self.live.setEnabled(False)
        self.camera = QtWidgets.QComboBox()
        self.camera.addItems(CAMERA_PRESETS)
        self.camera.setToolTip("Free: your view · Follow: chase the newest camera · Top: look down on the scene")
        self.thumbs = QtWidgets.QCheckBox("Thumbnails")
        self.thumbs.setChecked(True)
        self.thumbs.setToolTip(f"Show the images of the newest {MAX_THUMBNAILS} keyframes in their frustums")
        self.measure = QtWidgets.QPushButton("Measure")
        self.measure.setCheckable(True)
        self.measure.setToolTip("Click two points in the view to measure their distance")
        self.info = QtWidgets.QLabel("")
        self.info.setStyleSheet("color: #8a8f98;")
        self.info.setMinimumWidth(60)
        # the timeline (label, slider, position) and the tools; side by side when there is room,
        # else the tools go under the timeline, so the slider keeps a usable width at 1280x720
        self._head, self._tools = QtWidgets.QWidget(), QtWidgets.QWidget()
        for box, widgets in ((self._head, (QtWidgets.QLabel("Timeline"), self.slider, self.frame_label)),
                             (self._tools, (self.mode, self.live, QtWidgets.QLabel("Camera"), self.camera,
                                            self.thumbs, self.measure, self.info))):
            row = QtWidgets.QHBoxLayout(box)
            row.setContentsMargins(0, 0, 0, 0)
            row.setSpacing(6)
            for w in widgets:
                row.addWidget(w)
        self._head.layout().setStretchFactor(self.slider, 1)
        self._tools.layout().addStretch(1)
        self._grid = QtWidgets.QGridLayout(self)
        self._grid.setContentsMargins(0, 2, 0, 0)
        self._grid.setSpacing(6)
        self._grid.setSizeConstraint(QtWidgets.QLayout.SizeConstraint.SetNoConstraint)   # minimumSizeHint
        self.one_row: Optional[bool] = None
        self._arrange(True)

        self._debounce = QtCore.QTimer(self, singleShot=True, interval=120, timeout=self._apply_scrub)
        self.slider.valueChanged.connect(self._on_slider)
        self.mode.currentIndexChanged.connect(self._on_mode)
        self.live.clicked.connect(self.go_live)
        self.camera.currentIndexChanged.connect(lambda i: self.set_camera_preset(CAMERA_PRESETS[i]))
        self.measure.toggled.connect(self._on_measure_toggled)
        self.viewer.canvas.events.mouse_press.connect(self._on_press)
        self.viewer.canvas.events.mouse_release.connect(self._on_release)
        # measure overlay: the two picks and the segment between them, drawn over everything
        self._line = vscene.visuals.Line(color=(1.0, 0.3, 0.9, 1.0), width=2, parent=self.viewer.view.scene)
        self._markers = vscene.visuals.Markers(parent=self.viewer.view.scene)
        for v in (self._line, self._markers):
            v.set_gl_state(depth_test=False)
            v.order = 20
            v.visible = False
        window.framesShown.connect(self._on_frames_shown)
        self._rescan_clock = QtCore.QElapsedTimer()
        self._rescan_clock.start()
        self._scan = (None, None)                   # (future of the folder listing, its timeline)
        self._thumb_pool: list = []                      # vispy Image nodes, reused
        self._thumb_nodes: dict[int, object] = {}        # frame index -> its node in the pool
        self._thumb_images: dict[int, np.ndarray] = {}
        self._thumb_timer = QtCore.QTimer(self, singleShot=True, interval=1000, timeout=self.update_thumbnails)
        self.thumbs.toggled.connect(lambda *_: self.update_thumbnails())
        from .review_tools import ReviewTools       # crop, outliers, scale, floor, ground truth
        self.edit_tools = ReviewTools(self)
        self._grid.addWidget(self.edit_tools, 2, 0, 1, 2)
        self.click_handlers.append(self.edit_tools.click)

    # -- session ------------------------------------------------------------------------------

    MIN_TIMELINE_PX = 360        # the slider's width before the tools move under it

    def _arrange(self, one_row: bool) -> None:
        if one_row == self.one_row:
            return
        self.one_row = one_row
        self._grid.removeWidget(self._head)
        self._grid.removeWidget(self._tools)
        self._grid.addWidget(self._head, 0, 0)
        self._grid.addWidget(self._tools, 0, 1) if one_row else self._grid.addWidget(self._tools, 1, 0)
        self._grid.setColumnStretch(0, 1)
        self._grid.setColumnStretch(1, 0)
        self.updateGeometry()

    def minimumSizeHint(self) -> QtCore.QSize:
        """As narrow as the two-row arrangement allows (the one-row one must not hold the window wide)."""
        h = super().minimumSizeHint().height()
        return QtCore.QSize(max(self._head.minimumSizeHint().width(), self._tools.minimumSizeHint().width()), h)

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        need = self._tools.sizeHint().width() + self._head.minimumSizeHint().width() + self.MIN_TIMELINE_PX
        self._arrange(e.size().width() >= need)

    def reset(self) -> None:
        """A new run or session: forget the old timeline (and release its hold on the folder)."""
        if self.timeline is not None:
            self.timeline.close()
        self.timeline = None
        self._display_cache.clear()
        self._cached_points = 0
        self._frustum_depth = None
        self.shown_upto = None
        self.clicked_index = None
        self.shown_keyframes = 0
        self.points_from = None
        self._set_reviewing(False)
        self.slider.blockSignals(True)
        self.slider.setRange(0, 0)
        self.slider.blockSignals(False)
        self.slider.setEnabled(False)
        self.frame_label.setText("—")
        self._clear_measure()
        self._clear_thumbnails()
        self.edit_tools.set_session(None)

    def set_session(self, folder: Optional[str]) -> None:
        self.reset()
        if not folder:
            return
        try:
            self.timeline = SessionTimeline(folder, cache_frames=16)
        except Exception:          # a folder that is not (yet) a session: timeline stays off
            self.timeline = None
            return
        self.edit_tools.set_session(folder)
        self._update_range(follow_end=True)
        self._thumb_timer.start()           # a reopened session: its keyframes' thumbnails

    def _update_range(self, follow_end: bool) -> None:
        if self.timeline is None:
            return
        self._apply_range(self.timeline.refresh(), follow_end)

    def _apply_range(self, idx: list, follow_end: bool) -> None:
        if not idx:
            return
        self.slider.setEnabled(True)
        self.slider.blockSignals(True)
        self.slider.setRange(0, len(idx) - 1)
        if follow_end:
            self.slider.setValue(len(idx) - 1)
        self.slider.blockSignals(False)
        if not self.reviewing:
            self.frame_label.setText(f"frame {idx[-1]}")

    def _on_frames_shown(self, n: int) -> None:
        if not self._thumb_timer.isActive():
            self._thumb_timer.start()
        if self.timeline is None and self.window.session_folder:
            self.set_session(self.window.session_folder)
        elif self.timeline is not None:
            self._follow_scan()

    def _follow_scan(self) -> None:
        """While the run goes on, the slider follows the stored frames: the folder is listed on
        the engine's scan thread at most every 2 s (a long run holds tens of thousands of frame
        files), and the list is applied here at a later frame, unless the user started scrubbing
        or another session replaced this timeline meanwhile."""
        scan, timeline = self._scan
        if scan is not None and scan.done():
            self._scan = (None, None)
            try:
                idx = scan.result()
            except OSError:
                return                               # the folder went away: the next scan says more
            if timeline is self.timeline and not self.reviewing:
                self.timeline.indices = idx
                self._apply_range(idx, follow_end=True)
        elif scan is None and not self.reviewing and self._rescan_clock.elapsed() > 2000:
            self._rescan_clock.restart()
            self._scan = (self.timeline.scan_in_background(), self.timeline)

    # -- timeline -----------------------------------------------------------------------------
    def _set_reviewing(self, on: bool) -> None:
        if on != self.reviewing:
            self.reviewing = on
            self.live.setEnabled(on)
            self.reviewChanged.emit(on)

    def _on_slider(self, pos: int) -> None:
        if self.timeline is None or not self.timeline.indices:
            return
        self._set_reviewing(True)
        self.frame_label.setText(f"frame {self.timeline.indices[min(pos, len(self.timeline) - 1)]}")
        self._debounce.start()

    def _on_mode(self, *_) -> None:
        """A mode picked while following the run reviews the newest stored frame in that mode."""
        if self.reviewing:
            self._apply_scrub()
        elif self.current_mode() == "current" and self.timeline is not None and self.timeline.refresh():
            self.scrub_to(self.timeline.indices[-1])

    def scrub_to(self, frame_index: int, mode: Optional[str] = None) -> None:
        """Show the session up to `frame_index` (the nearest stored frame at or before it) at once."""
        if self.timeline is None:
            self.set_session(self.window.session_folder)
        if self.timeline is None:
            return
        idx = self.timeline.refresh()
        if mode is not None:
            self.mode.blockSignals(True)
            self.mode.setCurrentIndex(0 if mode == "accumulated" else 1)
            self.mode.blockSignals(False)
        pos = max(0, int(np.searchsorted(idx, frame_index, side="right")) - 1)
        self.slider.blockSignals(True)
        self.slider.setRange(0, len(idx) - 1)
        self.slider.setValue(pos)
        self.slider.blockSignals(False)
        self._set_reviewing(True)
        self._apply_scrub()

    def current_mode(self) -> str:
        return "accumulated" if self.mode.currentIndex() == 0 else "current"

    def _display(self, index: int, keep_images: bool):
        """DisplayFrame of a stored frame at the window's Subsample (cached without images)."""
        stride = int(self.window.stride.value())
        key = (index, stride)
        d = self._display_cache.get(key)
        if d is not None and not keep_images:
            self._display_cache.move_to_end(key)
            return d
        r = self.timeline.result(index)
        if r is None:
            return None
        d = make_display_frame(r, stride, frustum_depth=self._frustum_depth, keep_images=keep_images)
        if self._frustum_depth is None and len(d.depth):
            self._frustum_depth = FRUSTUM_FRACTION * d.median_depth
        d = self.edit_tools.display_filter(d)          # only what the session's edits keep
        if key not in self._display_cache:
            self._cached_points += len(d.points)
        self._display_cache[key] = dataclasses.replace(d, image=None, depth_map=None, conf_map=None,
                                                       depth_rgb=None)
        while self._cached_points > CACHE_POINTS and len(self._display_cache) > 1:
            _, old = self._display_cache.popitem(last=False)
            self._cached_points -= len(old.points)
        return d

    def _apply_scrub(self) -> None:
        if self.timeline is None or not self.timeline.indices:
            return
        idx = self.timeline.indices
        n = idx[min(self.slider.value(), len(idx) - 1)]
        mode = self.current_mode()
        cams, pts = frames_up_to(idx, n, mode)
        self.points_from = None
        if mode == "current" and pts:
            m = self._depth_frame(n, cams)
            if m is not None and m != n:           # n has no depth: the nearest earlier frame's points
                pts, self.points_from = [m], m
        incremental = (self.shown_upto is not None and mode == "accumulated" == self._shown_mode
                       and n > self.shown_upto)
        frames = []
        todo = [i for i in cams if i > self.shown_upto] if incremental else cams
        pts_set = set(pts)
        slow = sum(1 for i in todo if (i, int(self.window.stride.value())) not in self._display_cache) > 20
        if slow:                               # frames read from the store: say it is busy
            QtWidgets.QApplication.setOverrideCursor(QtCore.Qt.CursorShape.WaitCursor)
        try:
            frames = self._collect(todo, pts_set, n)
        finally:
            if slow:
                QtWidgets.QApplication.restoreOverrideCursor()
        self._show(frames, n, mode, cams, incremental)

    def _collect(self, todo, pts_set, n) -> list:
        frames = []
        for i in todo:
            d = self._display(i, keep_images=(i == n))
            if d is None:
                continue
            if i not in pts_set:               # "current frame": cameras only for earlier frames
                d = dataclasses.replace(d, points=d.points[:0], colors=d.colors[:0], conf=d.conf[:0],
                                        depth=d.depth[:0])
            frames.append(d)
        return frames

    def _show(self, frames, n, mode, cams, incremental) -> None:
        v = self.viewer
        cam = v.view.camera
        state = (cam.center, cam.distance, cam.azimuth, cam.elevation)
        if not incremental:
            v.clear()
            v.apply_events(self.timeline.events())   # every "realign", frame ranges included
        follow = v.follow
        v.follow = False
        if frames:
            v.add_frames(frames)
        v.follow = follow
        if self.window.viewer.frame_count and v.auto_fit and self.shown_upto is None:
            pass                                   # first review of a session: keep the fit
        else:
            cam.center, cam.distance, cam.azimuth, cam.elevation = state
            v.auto_fit = False
        kf = sum(1 for f in frames if f.is_keyframe)
        self.shown_keyframes = self.shown_keyframes + kf if incremental else kf
        self.shown_upto, self._shown_mode = n, mode
        last = next((f for f in reversed(frames) if f.index == n), None)
        if last is not None:
            if last.depth_map is None:          # no depth on this frame: the newest one before it
                m = self._depth_frame(n, cams)
                if m is not None:
                    self.window.preview.show_frame(self._display(m, keep_images=True), note=" · timeline")
            self.window.preview.show_frame(last, note=" · timeline")
        self.window.display.apply_threshold()
        text, tip = f"frame {n}" + (" only" if mode == "current" else ""), ""
        if self.points_from is not None:
            text = f"frame {n} · points of frame {self.points_from}"
            tip = (f"Frame {n} has no depth map (the engine computes depth on keyframes only): "
                   f"the points shown are those of frame {self.points_from}, the nearest earlier frame with depth")
        elif mode == "current" and last is not None and last.depth_map is None:
            text, tip = f"frame {n} only · no depth", "No stored frame up to this one has a depth map"
        self.frame_label.setText(text)
        self.frame_label.setToolTip(tip)
        self.update_thumbnails()
        v.canvas.update()

    def _depth_frame(self, n: int, cams) -> Optional[int]:
        """The newest stored frame at or before `n` with a depth map (searching DEPTH_LOOKBACK
        frames back), None if there is none."""
        for i in reversed([i for i in cams if i <= n][-DEPTH_LOOKBACK:]):
            r = self.timeline.result(i)
            if r is not None and r.depth is not None:
                return i
        return None

    def go_live(self) -> None:
        """Back to the whole session; a running reconstruction is drawn again as it comes."""
        if self.timeline is not None and self.timeline.refresh():
            self.slider.blockSignals(True)
            self.slider.setRange(0, len(self.timeline) - 1)
            self.slider.setValue(len(self.timeline) - 1)
            self.slider.blockSignals(False)
            self.mode.blockSignals(True)
            self.mode.setCurrentIndex(0)
            self.mode.blockSignals(False)
            if self.shown_upto is not None:
                self._apply_scrub()
        self.shown_upto = None
        self.points_from = None
        self.frame_label.setToolTip("")
        self._set_reviewing(False)
        self.update_thumbnails()
        if self.timeline is not None and self.timeline.indices:
            self.frame_label.setText(f"frame {self.timeline.indices[-1]}")

    # -- camera presets -----------------------------------------------------------------------
    def set_camera_preset(self, name: str) -> None:
        if name not in CAMERA_PRESETS:
            raise ValueError(name)
        i = CAMERA_PRESETS.index(name)
        if self.camera.currentIndex() != i:
            self.camera.blockSignals(True)
            self.camera.setCurrentIndex(i)
            self.camera.blockSignals(False)
        self.window.follow.setChecked(name == "Follow")
        if name == "Top":
            v = self.viewer
            v.reset_view()                  # frame the whole scene, then look straight down
            v.view.camera.elevation = 90.0
            v.view.camera.distance *= 1.3   # the 3/4 view's framing is tight from above
            v.auto_fit = False
            v.canvas.update()

    # -- clicks -------------------------------------------------------------------------------
    def _on_press(self, event) -> None:
        self._press = np.asarray(event.pos[:2], np.float64)

    def _on_release(self, event) -> None:
        if self._press is None:
            return
        pos = np.asarray(event.pos[:2], np.float64)
        if np.hypot(*(pos - self._press)) > CLICK_PX:
            return                          # a drag (orbit / pan), not a click
        self.click(pos)

    def click(self, pos) -> None:
        """What a click at canvas pixel `pos` does: a tool that took it (`click_handlers`: the edit
        row first), else a measure pick, else show the frame of the camera clicked."""
        if any(fn(pos) for fn in self.click_handlers):
            return
        if self.measure.isChecked():
            self._measure_pick(pos)
        else:
            self.pick_camera(pos)

    def pick_camera(self, pos) -> Optional[int]:
        """Show the frame of the camera clicked: the camera whose centre is nearest the click
        (within CAMERA_PICK_PX: the precise pick among overlapping frustums), else the front-most
        drawn frustum the click hits (its image rectangle, where the thumbnail is, or its edges)."""
        m = self.viewer.scene
        n = m.camera_count
        if not n:
            return None
        world = m.camera_centers()                # each camera placed by its frame's transform
        xy, w = project(self.viewer, world)
        k = pick_nearest(xy, w, pos, CAMERA_PICK_PX)
        if k is None and self.viewer.frustums.visible:
            k = self._pick_frustum(pos)
        if k is None:
            return None
        index = int(m.cam_index[k])
        self.show_frame(index)
        return index

    def _pick_frustum(self, pos) -> Optional[int]:
        """Camera row whose drawn frustum the click hits (keyframes; every frame's at half size
        with "Every frame", as ui/viewer.py draws them), None if none."""
        m = self.viewer.scene
        n = m.camera_count
        rows = np.arange(n) if self.viewer.all_frustums else np.flatnonzero(m.cam_keyframe[:n])
        if not len(rows):
            return None
        local = np.asarray(m.cam_frustum[rows], np.float64)          # apex, TL, TR, BR, BL
        small = ~m.cam_keyframe[rows]
        local[small, 1:] = local[small, :1] + 0.5 * (local[small, 1:] - local[small, :1])
        world = place(local, m.frame_matrices()[m.cam_frame[rows]])
        xy, w = project(self.viewer, world.reshape(-1, 3))
        xy, w = xy.reshape(-1, 5, 2), w.reshape(-1, 5)
        depth = np.where((w > 0).all(axis=1), w[:, 0], -1.0)       # a frustum crossing the eye: not picked
        k = pick_frustum(xy[:, 0], xy[:, 1:], depth, pos, FRUSTUM_PICK_PX)
        return None if k is None else int(rows[k])

    def show_frame(self, index: int) -> bool:
        """The stored frame `index` in the previews (image and depth of that same frame)."""
        if self.timeline is None and self.window.session_folder:
            self.set_session(self.window.session_folder)
        if self.timeline is None:
            return False
        d = self._display(index, keep_images=True)
        if d is None:
            return False
        self.window.preview.show_frame(d, note=" · clicked")
        self.clicked_index = index
        self.info.setText(f"camera {index}")
        return True

    def _on_measure_toggled(self, on: bool) -> None:
        self._clear_measure()
        self.info.setText("click two points" if on else "")

    def _clear_measure(self) -> None:
        self.measure_points = []
        self.distance = None
        self._line.visible = False
        self._markers.visible = False

    def _measure_pick(self, pos) -> Optional[np.ndarray]:
        p = self.pick_point(pos)
        if p is not None:
            self.add_measure_point(p)
        return p

    def pick_point(self, pos) -> Optional[np.ndarray]:
        """The world position of the front-most drawn point within POINT_PICK_PX of `pos`."""
        m = self.viewer.scene
        if not m.count:
            return None
        world = m.world_positions()
        conf = m.conf[: m.count]
        t = self.window.conf_threshold()
        if np.isfinite(t):                       # only what is drawn can be picked
            keep = conf >= t
            world = world[keep]
        xy, w = project(self.viewer, world)
        k = pick_nearest(xy, w, pos, POINT_PICK_PX)
        if k is None:
            self.info.setText("no point there")
            return None
        return np.asarray(world[k], np.float64)

    def add_measure_point(self, p) -> None:
        if len(self.measure_points) >= 2:
            self.measure_points = []
        self.measure_points.append(np.asarray(p, np.float64))
        pts = np.array(self.measure_points, np.float32)
        self._markers.set_data(pts, face_color=(1.0, 0.3, 0.9, 1.0), size=9, edge_width=0)
        self._markers.visible = True
        if len(self.measure_points) == 2:
            self.distance = float(np.linalg.norm(pts[1].astype(np.float64) - pts[0]))
            self._line.set_data(pts)
            self._line.visible = True
            self.info.setText(self.edit_tools.distance_text(self.distance))
            self.info.setToolTip("scene units; a monocular engine's scale is arbitrary (compare lengths "
                                 "within one run)")
            self.measured.emit(self.distance)
        else:
            self._line.visible = False
            self.distance = None
            self.info.setText("click a second point")
        self.viewer.canvas.update()


    # -- keyframe thumbnails ------------------------------------------------------------------
    # A fixed pool of at most MAX_THUMBNAILS Image nodes is reused (new data + transform) as
    # keyframes come and go: no visual, texture or program is created per keyframe, so a long
    # run at a neural engine's rate churns nothing.
    def _clear_thumbnails(self) -> None:
        for node in self._thumb_pool:
            node.visible = False
        self._thumb_nodes = {}
        self._thumb_images = {}

    def update_thumbnails(self, max_loads: int = 4) -> int:
        """Draw the newest keyframes' images in their frustums (at most MAX_THUMBNAILS; at most
        `max_loads` images read from the store per call, the rest on later calls). Returns the
        number of thumbnails drawn."""
        m = self.viewer.scene
        if not self.thumbs.isChecked() or self.timeline is None or not m.camera_count:
            self._clear_thumbnails()
            return 0
        n = m.camera_count
        kf = np.flatnonzero(m.cam_keyframe[:n])[-MAX_THUMBNAILS:]
        want = {int(m.cam_index[k]): int(k) for k in kf}
        for idx in [i for i in self._thumb_nodes if i not in want]:
            self._thumb_nodes.pop(idx).visible = False
        for idx in [i for i in self._thumb_images if i not in want]:
            del self._thumb_images[idx]
        free = [nd for nd in self._thumb_pool if not nd.visible]
        loads = 0
        for idx, k in want.items():
            img = self._thumb_images.get(idx)
            node = self._thumb_nodes.get(idx)
            if img is None:
                if loads >= max_loads:
                    continue
                loads += 1
                r = self.timeline.result(idx)
                if r is None or not np.size(r.image):
                    continue                  # not on disk yet (a live run): next time
                step = max(1, int(np.shape(r.image)[1]) // THUMB_WIDTH)
                img = np.ascontiguousarray(np.asarray(r.image)[::step, ::step])
                self._thumb_images[idx] = img
                node = None                   # (re)load the texture below
            if node is None:
                if free:
                    node = free.pop()
                    node.set_data(img)
                elif len(self._thumb_pool) < MAX_THUMBNAILS:
                    node = vscene.visuals.Image(img, parent=self.viewer.view.scene, interpolation="linear")
                    node.set_gl_state(depth_test=True, cull_face=False)
                    node.transform = MatrixTransform()
                    self._thumb_pool.append(node)
                else:
                    continue
                node.visible = True
                self._thumb_nodes[idx] = node
            corners = np.array([_to_world(m, c, int(m.cam_frame[k])) for c in m.cam_frustum[k][1:5]])
            node.transform.matrix = _image_plane(corners, img.shape[1], img.shape[0])
        self.viewer.canvas.update()
        if loads >= max_loads and not self._thumb_timer.isActive():
            self._thumb_timer.start()          # more to read
        return len(self._thumb_nodes)


def _image_plane(corners: np.ndarray, w: int, h: int) -> np.ndarray:
    """vispy row-vector matrix mapping image pixel (x, y, 0) onto the frustum's image rectangle
    (corners TL, TR, BR, BL in world)."""
    tl, tr, _, bl = np.asarray(corners, np.float64)
    ex, ey = (tr - tl) / max(w, 1), (bl - tl) / max(h, 1)
    n = np.cross(ex, ey)
    M = np.eye(4)
    M[0, :3], M[1, :3], M[2, :3], M[3, :3] = ex, ey, n / (np.linalg.norm(n) or 1.0), tl
    return M


def _to_world(m, p, frame: int) -> np.ndarray:
    """Point p of frame `frame` (sequence number in the SceneModel) placed in the world."""
    T = m.frame_transform(frame)
    return T[:3, :3] @ np.asarray(p, np.float64) + T[:3, 3]
