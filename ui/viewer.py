"""Live 3D viewer: a vispy SceneCanvas embedded in Qt drawing an `engine.scene.SceneModel`.
Over 800 lines on purpose: what to draw and when (the detail chosen per draw, the refinement
chunks, the catch-up uploads and the framing) share one timing state, the measured cost per
point, and the tests tune its constants here; the GL side lives in ui/cloud_visual.py.

The scene state (points under a point budget, their thinning, cameras, segment transforms) is
the Qt-free `SceneModel`; this module only draws it. After each batch the viewer asks the model
which rows changed (`take_changes`) and uploads exactly those: appends cost O(new points), a
thinning pass costs one upload of the rows it rewrote, and the GPU buffers grow by doubling up to
the model's capacity (≤ the point budget) and then stay that size.

Why a custom visual: vispy's stock Markers re-upload the whole cloud on every `set_data`, which
costs O(total points) per frame. Here every attribute (position, colour, confidence,
depth+segment) lives in ONE GPU vertex buffer written with `set_subdata`. Everything the user tunes live — confidence threshold,
point size, colour mode — is a shader uniform, so changing it uploads no vertex data. Each vertex
carries its frame's sequence number; the per-frame transforms (`SceneModel.frame_matrices`) live
in one float texture shared by every layer (256 matrices per texture row), so a re-alignment
event — a whole segment or a loop closure's frame range — moves already-drawn points and cameras
by rewriting the texture rows of the frames it covers (64 bytes per frame), not their points.
The trajectory and the camera frustums use the same visual in line mode (also append-only).

Level of detail: a software rasteriser (Mesa llvmpipe) draws ~1 M points a second or less, so
the full 4 M-point budget would be a slideshow that blocks the GUI thread for seconds per
redraw. The view therefore draws the largest prefix of the scene model's draw order (levels,
`SceneModel.choose_detail`: spatially even) that fits `frame_time_target_ms` at the measured
cost per point, plus the newest LIVE_FRAMES frames in full (the live edge stays sharp). Each
level keeps an index list of its rows (`LevelIndex`: append-only, truncated and refilled only
from the first row a thinning pass rewrote), so a reduced draw is one glDrawElements per level
plus one glDrawArrays of the live rows: its cost is that of the points drawn, not of the scene.
Nothing on the GUI thread is allowed to cost seconds: once the camera and the scene have stood
still for a few of their recent intervals between changes (IDLE_MIN_MS to IDLE_REFINE_MS) the
left-out points are added in chunks on top of the picture the widget
keeps (no clear), drawn into its framebuffer without a paint and shown by a paint every
REFINE_SHOW_MS (a paint also reads the picture back and puts it on screen, ui/gl_readback.py);
the newest frames are drawn in full while they fit half the points of a frame-time target (the
newest always); the level lists' GPU side is fixed-size index blocks from one pool, so a list
never re-uploads its entries as it grows; the rows a thinning pass rewrote are uploaded a bounded
piece per draw while the previous layout's lists keep the picture whole ("uploads in pieces").
`detail_changed` tells the window when detail is reduced (`detail_text`).

The viewer does no geometry: points come back-projected by `engine.geometry` (see ui/display.py);
framing and the chase view are `SceneModel.framing` and `engine.scene.chase_view`.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Iterable, Optional

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets
from vispy import gloo, scene

from engine.scene import DEFAULT_CAMERA_BUDGET, DEFAULT_POINT_BUDGET, LOD_LEVELS, SceneModel, chase_view

from .cloud_visual import (FRUSTUM_VERTICES, TRAJECTORY_VERTICES, FrameTransforms, IndexBlocks,  # noqa: F401
                           LevelIndex, SegmentCloud, SegmentCloudVisual, pack_rgb)
from .gl_readback import ReadbackCanvasBackend
from .settings_schema import COLOR_MODES, default

log = logging.getLogger(__name__)

# Mesa llvmpipe (software OpenGL: no GPU, VMs, Xvfb) hands each frame's binned points to
# rasteriser threads and, with those threads, keeps 64 KiB blocks per point drawn, more with every
# redraw of the same cloud (docs/benchmarks_gui.md). Rasterising on the drawing thread (0 threads)
# holds none of it, and the view caps its redraw rate anyway. Set before the first GL context; a user's
# LP_NUM_THREADS wins. Hardware drivers do not read it.
SOFTWARE_GL_THREADS = "0"
os.environ.setdefault("LP_NUM_THREADS", SOFTWARE_GL_THREADS)

UPLOAD_CHUNK = 1 << 18          # point rows uploaded per GL flush (bounds the copies in flight: ~10 MB)
_OVERLAY_CONF = 3.0e38          # lines carry this confidence so the threshold never hides them

# Level of detail (module docstring). The frame-time target is the display setting
# "display/frame_time_target_ms" (ui/settings_schema.py), set on the viewer by the window.
FRAME_TIME_TARGET_MS = default("display/frame_time_target_ms")
LIVE_FRAMES = 2                 # newest frames drawn in full whatever the detail
IDLE_REFINE_MS = 500            # camera and scene still this long: start adding what was left out;
IDLE_MIN_MS = 150               # sooner, down to this, when the view was changing at a fast cadence:
IDLE_CADENCES = 2.5             # still for this many of its recent intervals between changes
REFINE_PAUSE_MS = 5             # between refinement chunks: the event loop runs in between
REFINE_SHOW_MS = 400            # refinement chunks drawn unseen in between, shown at this interval
FIT_INTERVAL_S = 0.5            # auto-framing follows the growing cloud at most this often
REFINE_CHUNK_TARGETS = 2        # a refinement chunk: this many frame-time targets of points (the
                                # view is still; larger chunks spend less on each paint's fixed cost)
PROBE_POINTS = 200_000          # drawn at most before the cost per point has been measured

class ViewerCanvas(scene.SceneCanvas):
    """The SceneCanvas, with an adaptive redraw cap: redraws are spaced so that drawing takes
    at most DRAW_BUDGET of the GUI thread's time (a GPU draws in ~1 ms → up to MAX_FPS; a
    software rasteriser taking the viewer's 50 ms frame-time target → 10 Hz). Requests in
    between are merged into one deferred redraw, so a slow view drops frames instead of
    starving the event loop. Counts draws so the window can show the viewer's FPS; each draw
    ends with glFinish so its measured time includes the rasterisation (software GL rasterises
    at the flush), and `post_draw(ms)` hands that time less the uploads (`pre_draw`: after a
    thinning pass they are millions of rows, which says nothing of the cost per point drawn)
    to the viewer's level of detail. A
    draw with `refining` set (a refinement chunk) stays out of the average that spaces redraws;
    one with `accumulate` set is drawn over the kept picture (no clear)."""

    DRAW_BUDGET = 0.5
    MAX_FPS = 60.0

    def __init__(self, **kw):
        super().__init__(keys="interactive", bgcolor="#1b1d22", show=False, **kw)
        self.unfreeze()
        self.draws = 0
        self.draw_ms = 0.0                    # moving average of one draw
        self.pre_draw = None                  # called before every draw (uploads pending data)
        self.post_draw = None                 # called after every draw with its time in ms
        self.pre_draw_ms = 0.0                # of the last draw: uploads (executed in pre_draw)
        self.refining = False                 # this draw is a refinement chunk (not in draw_ms)
        self.accumulate = False               # this draw adds to the picture: no clear
        self.offscreen = False                # inside render(): a fresh framebuffer
        self._in_pre_draw = False
        self._last_draw = -1e9
        # parented to the native widget: the timer dies with it (no redraw of a deleted canvas)
        self._deferred = QtCore.QTimer(self.native, singleShot=True)
        self._deferred.timeout.connect(self._update_now)
        self.freeze()

    def min_interval(self) -> float:
        return max(1.0 / self.MAX_FPS, self.draw_ms / 1000.0 / self.DRAW_BUDGET)

    def update(self, node=None):
        if not hasattr(self, "_deferred"):     # called while the base class initialises
            return super().update(node)
        if self._in_pre_draw:
            return
        wait = self._last_draw + self.min_interval() - time.perf_counter()
        if wait <= 0:
            super().update(node)
        elif not self._deferred.isActive():
            self._deferred.start(int(wait * 1000) + 1)

    def _update_now(self):
        try:
            super().update()
        except RuntimeError:     # the Qt widget went away between the request and the timer
            pass

    def update_now(self):
        """Request a draw now, past the redraw cap (refinement chunks: the view is still)."""
        self._deferred.stop()
        self._update_now()

    def create_native(self):
        """The widget is `ReadbackCanvasBackend` (ui/gl_readback.py), not vispy's QOpenGLWidget:
        Qt composes a window holding a QOpenGLWidget through OpenGL on every paint, which on a
        software renderer costs as much as the view's reduced draw."""
        if self._backend is not None:
            return
        ReadbackCanvasBackend(self, **self._backend_kwargs)
        self._backend_kwargs = None
        # as vispy's Canvas.create_native: run the GL commands queued, then swap (a no-op here)
        self.events.draw.connect(self.context.flush_commands, position="last")
        if self._autoswap:
            self.events.draw.connect((self, "swap_buffers"), ref=True, position="last")

    def draw_unshown(self) -> bool:
        """Draw into the widget's kept framebuffer now, without a paint (a paint also reads the
        picture back and puts it on screen). The next paint shows what was drawn. False when
        the widget cannot be drawn to (not shown yet)."""
        native = self.native
        if not (native.isVisible() and native.isValid()):
            return False
        self._deferred.stop()
        self.set_current()                    # binds the kept framebuffer
        try:
            self.events.draw(region=None)
        finally:
            native.doneCurrent()
        return True

    def render(self, *a, **kw):
        self.offscreen = True
        try:
            return super().render(*a, **kw)
        finally:
            self.offscreen = False

    def _draw_scene(self, bgcolor=None):
        # Uploads are queued here, right before the draw that flushes them: vispy queues GL
        # commands until the next draw, so uploading per batch while the window is hidden or
        # minimised (no draws) would grow that queue without bound.
        if self.pre_draw is not None:
            self._in_pre_draw = True          # the uploads' update requests: this draw serves them
            t0 = time.perf_counter()
            try:
                self.pre_draw()
            finally:
                self._in_pre_draw = False
                self.pre_draw_ms = (time.perf_counter() - t0) * 1000.0
        if self.accumulate and not self.offscreen:
            self.draw_visual(self.scene)      # on top of the picture kept by the widget's framebuffer
        else:
            super()._draw_scene(bgcolor=bgcolor)

    def on_draw(self, event):
        t0 = time.perf_counter()
        self.pre_draw_ms = 0.0
        super().on_draw(event)
        self.context.finish()
        dt = (time.perf_counter() - t0) * 1000.0
        if not self.refining:
            self.draw_ms = dt if self.draws == 0 else 0.8 * self.draw_ms + 0.2 * dt
        self._last_draw = t0
        self.draws += 1
        if self.post_draw is not None:     # the drawing alone: uploads do not scale with points drawn
            self.post_draw(max(0.0, dt - self.pre_draw_ms))


class PointCloudViewer(QtWidgets.QWidget):
    """Qt widget hosting the canvas: point cloud, trajectory, frustums, current camera.

    Feed it `ui.display.DisplayFrame`s with `add_frames`; re-place segments or frame ranges with
    `apply_realign` / `apply_events` (engine "realign" events, as the exports apply them).
    The scene state lives in `self.scene` (an `engine.scene.SceneModel`, bounded by
    `point_budget`); this widget draws it.
    """

    drawn = QtCore.Signal()
    detail_changed = QtCore.Signal(float)    # fraction of the scene's points drawn (1.0 = all)

    def __init__(self, parent: Optional[QtWidgets.QWidget] = None, capacity: int = 1 << 20,
                 point_budget: int = DEFAULT_POINT_BUDGET, camera_budget: int = DEFAULT_CAMERA_BUDGET):
        super().__init__(parent)
        self.scene = SceneModel(point_budget, camera_budget=camera_budget, initial_capacity=capacity,
                                background=True)
        self.canvas = ViewerCanvas()
        self.view = self.canvas.central_widget.add_view()
        self.view.camera = scene.cameras.TurntableCamera(up="-y", fov=50.0, elevation=20.0,
                                                         azimuth=90.0, distance=3.0)
        self.frame_xf = FrameTransforms()        # per-frame placement, shared by every layer
        xf = self.frame_xf
        self.cloud = SegmentCloud(mode="points", capacity=self.scene.capacity, mirror=False,
                                  frame_xf=xf, parent=self.view.scene)
        self.cloud.time_draws = True
        # overlays sized once at the scene's camera budget (which decimates old cameras): their
        # buffers never grow, so a long run's buffer bytes stay flat (issue #7)
        cams = self.scene.camera_budget
        self.trajectory = SegmentCloud(mode="lines", capacity=TRAJECTORY_VERTICES * cams, overlay=True,
                                       frame_xf=xf, parent=self.view.scene)
        self.frustums = SegmentCloud(mode="lines", capacity=FRUSTUM_VERTICES * cams, overlay=True,
                                     frame_xf=xf, parent=self.view.scene)
        self.current = SegmentCloud(mode="lines", capacity=64, overlay=True, frame_xf=xf,
                                    parent=self.view.scene)
        self.current.set_gl_state(depth_test=False)
        # the trajectory is drawn last and over everything: frustums and points never hide it
        self.trajectory.set_gl_state(depth_test=False)
        self.trajectory.order = 10
        self.current.order = 11
        self.all_frustums = False      # keyframes only by default (every frame: set_all_frustums)
        self._layers = (self.cloud, self.trajectory, self.frustums, self.current)
        self.canvas.pre_draw = self.sync
        self.canvas.post_draw = self._measured
        blocks = IndexBlocks()                   # the level lists' GPU index blocks (shared, reused)
        self.index_blocks = blocks
        self.levels = LevelIndex(pool=blocks)    # per draw-order level: its rows (index buffers)
        self._spare_levels = LevelIndex(pool=blocks)   # the other of a pair: the old lists during a catch-up
        self._tail_levels = LevelIndex(pool=blocks)    # during a catch-up: rows from _tail_from on
        self._stale: Optional[LevelIndex] = None
        self._catch = None                       # a catch-up in progress (uploads in pieces)
        self._w = self._tail_from = self._tail_hi = 0
        self._upload_s_per_row: Optional[float] = None
        self.catch_ups = 0
        self.max_upload_rows: Optional[int] = None   # tests: a fixed piece instead of the measured one
        self.frame_time_target_ms = FRAME_TIME_TARGET_MS
        self.cost_per_point_ms: Optional[float] = None   # measured (moving average) per point drawn
        self.measure_cost = True                 # tests inject cost_per_point_ms and set this False
        self.drawn_points = 0                    # cloud points in the picture on screen
        self.paint_points = 0                    # cloud points drawn by the last draw
        self.plan_level = LOD_LEVELS - 1         # levels 0..plan_level of the draw order drawn
        self.detail_fraction = 1.0
        self.full_render = False                 # offscreen renders draw everything (screenshot)
        self.unshown_chunks = 0                  # of those, drawn without a paint (shown by a later one)
        self.refine_chunks = 0                   # refinement draws so far, and the largest one
        self.max_chunk_points = 0
        self._look_gen = 0                       # bumped by changes the still-key cannot see
        self._full_key = None                    # still-state for which everything is on screen
        self._base = None                        # the last cleared on-screen draw (what it left out)
        self._refinement = None                  # refinement in progress: queue and position
        self._step_next = False                  # the next draw is a refinement chunk
        self._chunk_ibo = gloo.IndexBuffer(np.zeros(1, np.uint32))
        self._changed_at = -1e9                  # the last cleared draw of a changed picture
        self._change_interval = IDLE_REFINE_MS / 1000.0   # moving average of the intervals between those
        self._idle = QtCore.QTimer(self, singleShot=True, interval=IDLE_REFINE_MS)
        self._idle.timeout.connect(self._idle_elapsed)
        self._step_timer = QtCore.QTimer(self, singleShot=True)
        self._step_timer.timeout.connect(self._refine_step)
        self.auto_fit = True
        self._fitted = -1e9                      # when auto-framing last ran
        self._fit_timer = QtCore.QTimer(self, singleShot=True)
        self._fit_timer.timeout.connect(self._deferred_fit)
        self.canvas.events.mouse_press.connect(self._on_mouse_press)
        self.canvas.events.mouse_wheel.connect(self._on_mouse_press)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.canvas.native)
        self.hint = QtWidgets.QLabel("Choose a video, an image folder or a webcam, then press Start\n"
                                     "(drag to orbit, right-drag or wheel to zoom, shift-drag to pan)", self)
        self.hint.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
        self.hint.setStyleSheet("color: #8a8f98; background: transparent; font-size: 13px;")
        self.setMinimumSize(320, 240)
        self.setAcceptDrops(False)
        self.clear()

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self.hint.setGeometry(0, 0, self.width(), self.height())

    # -- state --------------------------------------------------------------------------------
    def clear(self) -> None:
        """Empty scene (a new run). Buffers keep their capacity, so a restart allocates nothing."""
        self.scene.clear()
        for layer in self._layers:
            layer.clear()
        if hasattr(self, "levels"):
            self.levels.clear()
            if self._stale is not None:
                self._retire_stale()
            self._catch = None
            self._w = self._tail_from = self._tail_hi = 0
            self.scene.hold_passes = False
            self.cloud.draw_plan = None
            self._full_key = self._base = self._refinement = None
            self.drawn_points = self.paint_points = 0
            self._look_gen += 1
        self.frame_xf.reset()
        self.result_width = 0       # width of the live results (for matching export density)
        self._last_center: dict[int, tuple] = {}   # segment → (last camera centre drawn, its frame)
        self._last_frame = None
        self._last_seq = 0          # the newest frame's sequence number in the scene model
        self._current_shown = None
        self._rebuild_cameras = False
        self._dirty = True
        self.follow = getattr(self, "follow", False)
        self.auto_fit = True
        if hasattr(self, "hint"):
            self.hint.show()
        self.canvas.update()

    def set_point_budget(self, budget: int) -> None:
        """Points kept at most; a smaller budget thins the scene at the next frame."""
        self.scene.set_point_budget(budget)

    @property
    def point_budget(self) -> int:
        return self.scene.point_budget

    @property
    def segments(self) -> dict:
        return self.scene.segments

    @property
    def conf_range(self) -> tuple:
        return self.scene.conf_range

    @property
    def frame_count(self) -> int:
        return self.scene.frames_added

    @property
    def point_count(self) -> int:
        """Points in the scene (on the GPU from the next redraw on)."""
        return self.scene.count

    def conf_values(self) -> np.ndarray:
        """Confidences of the points loaded (a view of the scene model; read-only use)."""
        return self.scene.conf[: self.scene.count]

    @property
    def frustum_count(self) -> int:
        """Camera frustums in the scene (on the GPU from the next redraw on)."""
        return self.scene.camera_count

    @property
    def trajectory_count(self) -> int:
        """Number of camera positions on the trajectory."""
        return self.scene.camera_count

    @property
    def uploaded_bytes(self) -> int:
        """Vertex bytes sent to the GPU so far (every layer) — tests check what costs uploads."""
        return sum(layer.uploaded_bytes for layer in self._layers)

    @property
    def buffer_bytes(self) -> int:
        """GPU bytes allocated for vertices (every layer): bounded by the point budget."""
        return sum(layer.buffer_bytes for layer in self._layers)

    # -- data ---------------------------------------------------------------------------------
    def add_frames(self, frames: Iterable) -> None:
        """Add frames to the scene model; the GPU gets them at the next redraw (`sync`)."""
        last = None
        self.hint.hide()
        for f in frames:
            self.scene.add_frame(f)
            self.result_width = int(f.width)
            last = f
        if last is None:
            return
        self._last_frame = last
        self._last_seq = self.scene.frames_added - 1
        self._dirty = True
        if self.follow:
            self._follow(last)
        elif self.auto_fit:
            wait = self._fitted + FIT_INTERVAL_S - time.perf_counter()
            if wait <= 0:
                self._fit(keep_angles=True)
            elif not self._fit_timer.isActive():  # the frames since: framed a moment later
                self._fit_timer.start(int(1000 * wait) + 1)
        self.canvas.update()

    def sync(self) -> None:
        """Upload what changed since the last sync and choose what the cloud draws: called
        before each draw, so the cost is O(rows changed since the last draw) and nothing queues
        up while nothing is drawn."""
        if self._dirty or self._catch is not None:       # a catch-up goes on at every draw
            self._dirty = False
            self._sync_data()
        self._plan_draw()

    def _sync_data(self) -> None:
        if self._last_frame is not None and self._last_frame is not self._current_shown:
            self._set_current(self._last_frame)
            self._current_shown = self._last_frame
        m = self.scene
        ch = m.take_changes()
        if ch.capacity_changed or self.cloud.capacity != m.capacity:
            self.cloud.reserve(m.capacity)       # re-allocated empty: everything is uploaded again
            self._begin_catch_up(0, keep_old=False)
        elif ch.points_from < self._tail_hi:     # a thinning pass rewrote rows the GPU holds
            self._begin_catch_up(ch.points_from, keep_old=True)
        elif self._catch is None and m.count - self._tail_hi > self.upload_rows_per_draw:
            self._begin_catch_up(self._tail_hi, keep_old=False)   # a large batch: in pieces too
        self._upload_points()
        self.cloud.set_uniform("u_conf_range", m.conf_range)
        if m.depth_hi > 0:
            self.cloud.set_uniform("u_depth_range", (0.0, m.depth_hi))
        if ch.cameras_from < self.frustums.count // 16 or self._rebuild_cameras:   # decimated / restyled
            self._rebuild_cameras = False
            self.frustums.clear()
            self.trajectory.clear()
            self._last_center = {}
        # vispy queues a layer's uploads until it is next drawn: while both overlays are hidden
        # nothing is uploaded (the queue would grow with the run); showing one catches up
        if self.frustums.visible or self.trajectory.visible:
            self._append_cameras(self.frustums.count // 16, m.camera_count)
        if ch.transforms_from < ch.frames:       # new frames, re-alignments since the last draw
            self.frame_xf.write(ch.transforms_from, m.frame_matrices(ch.transforms_from, ch.frames))
            for layer in self._layers:
                layer.set_uniform("u_xf_rows", float(self.frame_xf.rows))

    # -- uploads in pieces ---------------------------------------------------------------------
    # The GPU rows [0, _w) and [_tail_from, _tail_hi) equal the model's; rows [_w, _tail_from)
    # still hold what they held before the last thinning pass rewrote them (a "catch-up" is in
    # progress while _w < _tail_from). Each draw uploads the new rows and the newest frames
    # first, then at most UPLOAD_ROWS_PER_DRAW rewritten rows, so a pass over millions of rows
    # costs a few bounded draws, not one draw of seconds. Meanwhile the previous level index
    # lists (`_stale`: rows of the layout before the pass, whose GPU rows from _w on are still
    # that layout's) are drawn too, so nothing disappears; the model holds back the next pass
    # until the catch-up is done.
    def _begin_catch_up(self, row: int, keep_old: bool) -> None:
        """Rows from `row` on were rewritten (keep_old: the GPU rows still hold the old layout;
        False after the buffers were re-allocated empty)."""
        m = self.scene
        row = min(row, self._w)
        if not keep_old:                         # nothing of the old layout is left on the GPU
            if self._stale is not None:
                self._retire_stale()
            self.levels.update(m, row, row)      # truncate
        elif self._catch is None:                # the lists of the old layout are drawn meanwhile
            self._stale, self.levels = self.levels, self._spare_levels
            self.levels.copy_prefix(self._stale, row)
        else:                                    # another pass while catching up: the old lists
            self.levels.update(m, row, row)      # still point at rows of an older layout
        self._catch = True
        self._w = row
        # the newest frames' rows and those appended from now on form the tail: uploaded at
        # once, with index lists of their own (append-only) until the catch-up reaches them
        live_from = m.first_row_of_frame(max(0, m.frames_added - LIVE_FRAMES))
        self._tail_from = self._tail_hi = min(max(row, live_from), m.count)
        self._tail_levels.clear()
        m.hold_passes = True

    def _retire_stale(self) -> None:
        """The old layout's lists are no longer drawn: they become the spare, their blocks freed."""
        self._spare_levels, self._stale = self._stale, None
        self._spare_levels.clear()

    def _upload_points(self) -> None:
        m = self.scene
        n = m.count
        if self._catch is None:                  # only new rows (or rows removed at the end)
            if self._tail_hi != n:
                self._upload_rows(min(self._tail_hi, n), n)
                self.levels.update(m, min(self._tail_hi, n))
            self._w = self._tail_from = self._tail_hi = n
            self.cloud.set_count(n)
            return
        if n < self._tail_hi:                    # rows removed (a budget lowered): start again
            self._tail_hi = self._tail_from = max(self._w, n)
            self._tail_levels.clear()
        if self._tail_hi < n:                    # the newest frames and rows appended since
            self._upload_rows(self._tail_hi, n)
            self._tail_levels.update(m, self._tail_hi, n)
            self._tail_hi = n
        t0 = time.perf_counter()
        step = self.upload_rows_per_draw
        if self.canvas.offscreen and self.full_render:
            step = self._tail_from              # a screenshot shows the model as it is
        hi = min(self._w + step, self._tail_from)
        if hi > self._w:
            self._upload_rows(self._w, hi)
            self.levels.update(m, self._w, hi)
            dt = (time.perf_counter() - t0) / (hi - self._w)
            self._upload_s_per_row = dt if self._upload_s_per_row is None else 0.7 * self._upload_s_per_row + 0.3 * dt
            self._w = hi
        if self._w >= self._tail_from:           # caught up: the tail rows join the index lists
            self.levels.update(m, self._w, n)
            self._tail_levels.clear()
            self._w = self._tail_from = self._tail_hi = n
            self._catch = None
            if self._stale is not None:
                self._retire_stale()
            m.hold_passes = False
            self.catch_ups += 1
        self.cloud.set_count(self._tail_hi)

    @property
    def upload_rows_per_draw(self) -> int:
        """Rewritten rows uploaded per draw: half the frame-time target at the measured upload
        cost per row, between UPLOAD_CHUNK / 4 and UPLOAD_CHUNK (a cost measured at a quiet
        moment must not make a piece that blocks for long once the machine is busy)."""
        if self.max_upload_rows is not None:
            return self.max_upload_rows
        per_row = self._upload_s_per_row
        if per_row is None:
            return UPLOAD_CHUNK // 4
        return min(UPLOAD_CHUNK, max(UPLOAD_CHUNK // 4, int(0.5e-3 * self.frame_time_target_ms / max(per_row, 1e-12))))

    @property
    def catching_up(self) -> bool:
        """Whether rows a thinning pass rewrote are still being uploaded (a piece per draw)."""
        return self._catch is not None

    # -- level of detail ----------------------------------------------------------------------
    def _still_key(self) -> tuple:
        """Everything the picture depends on: while it is unchanged, refinement chunks add to
        the picture on screen; any change means a fresh (cleared) draw."""
        m = self.scene
        return (repr(self.view.camera.get_state()), m.frames_added, m.count, m.thinning_passes,
                len(m.events), m.events_dropped, tuple(self.canvas.size), self._look_gen,
                tuple(sorted(self.cloud._uniforms.items())),
                tuple((layer.visible, layer.count) for layer in self._layers[1:]))

    def _live_from(self, budget: float) -> int:
        """First row drawn in full: the newest LIVE_FRAMES frames', fewer frames when they would
        take more than half the point budget (the newest frame is always drawn in full)."""
        m = self.scene
        for k in range(LIVE_FRAMES, 1, -1):
            row = m.first_row_of_frame(max(0, m.frames_added - k))
            if m.count - row <= budget / 2:
                return row
        return m.first_row_of_frame(max(0, m.frames_added - 1))

    def _point_budget_now(self) -> float:
        cost = self.cost_per_point_ms
        return PROBE_POINTS if cost is None else self.frame_time_target_ms / max(cost, 1e-9)

    def _plan_draw(self) -> None:
        """Choose the cloud's draw. A refinement step (requested by `_refine_step`, nothing
        changed since the draw before) draws the next chunk of the points not yet on screen
        into the picture without clearing it. Any other on-screen draw is a cleared draw of
        the largest draw-order prefix that fits the frame-time target at the measured cost per
        point, plus the newest LIVE_FRAMES frames in full; its leftovers are refined once the
        view has stood still for IDLE_REFINE_MS. Offscreen renders (`render_image`) draw the
        same prefix, or everything for `screenshot` (`full_render`)."""
        m = self.scene
        key = self._still_key()
        offscreen = self.canvas.offscreen
        self.canvas.accumulate = False
        self.canvas.refining = False
        if not offscreen:
            step, self._step_next = self._step_next, False
            if step and self._refinement is not None and self._refinement["key"] == key:
                self._draw_chunk(key)
                return
            self._refinement = None
        if m.count == 0 or (offscreen and self.full_render):
            level, drawn, live_from = LOD_LEVELS - 1, m.count, m.count
        else:
            budget = self._point_budget_now()
            live_from = self._live_from(budget)
            if self._catch is not None:
                live_from = max(live_from, self._tail_from)
                budget /= 2 if self._stale is not None else 1   # the old lists are drawn too
            level, drawn = m.choose_detail(budget, live_from)
        self.plan_level = level                  # the draw order's levels in this draw (tests, tools)
        if self._catch is not None and m.count and not (offscreen and self.full_render):
            views = [v for j in range(level + 1) for v in self.levels.views(j, self.levels.count_before(j, self._w))]
            if self._stale is not None:
                views += [v for j in range(level + 1) for v in self._stale.views(j, self._stale.used[j])]
            views += [v for j in range(level + 1)
                      for v in self._tail_levels.views(j, self._tail_levels.count_before(j, live_from))]
            self.cloud.draw_plan = (views, (live_from, self._tail_hi - live_from))
            self.paint_points = sum(k for _, k in views) + self._tail_hi - live_from
            self._set_drawn(min(drawn, m.count - 1))
            return                               # refined once caught up
        self.paint_points = drawn
        if drawn >= m.count:
            self.cloud.draw_plan = None
            if not offscreen:
                self._full_key = key
        else:
            views = [v for j in range(level + 1) for v in self.levels.views(j, self.levels.count_before(j, live_from))]
            self.cloud.draw_plan = (views, (live_from, m.count - live_from))
            if not offscreen:
                changed = self._base is None or self._base["key"] != key
                self._base = {"key": key, "level": level, "live_from": live_from, "drawn": drawn}
                if key == self._full_key:        # was complete a moment ago: refine at once
                    self._begin_refine()
                else:                            # (re)started: fires once nothing moved for a while
                    self._idle.start(self._idle_wait_ms(changed))
        self._set_drawn(drawn)

    def _idle_wait_ms(self, changed: bool) -> int:
        """How long the view must stand still before refining: IDLE_CADENCES of the recent
        intervals between changes (a moving average, each interval counted up to IDLE_REFINE_MS),
        between IDLE_MIN_MS and IDLE_REFINE_MS. Frames arriving at 10 Hz, or a camera dragged,
        are over after a few of their intervals; a slow engine's frames keep the long wait, so
        refinement does not take the CPU between them."""
        if changed:
            now = time.perf_counter()
            gap = min(now - self._changed_at, IDLE_REFINE_MS / 1000.0)
            self._changed_at = now
            self._change_interval = 0.7 * self._change_interval + 0.3 * gap
        return int(min(IDLE_REFINE_MS, max(IDLE_MIN_MS, IDLE_CADENCES * 1000.0 * self._change_interval)))

    def _set_drawn(self, drawn: int) -> None:
        m = self.scene
        self.drawn_points = drawn
        fraction = drawn / m.count if m.count else 1.0
        if (fraction < 1.0) != (self.detail_fraction < 1.0) or abs(fraction - self.detail_fraction) > 0.01:
            self.detail_fraction = fraction
            self.detail_changed.emit(fraction)

    def _refine_queue(self, base: dict) -> list:
        """Row lists of what the base draw left out, coarse levels first: levels above its
        level, rows before its live rows (host copies of the per-level index lists)."""
        lf = base["live_from"]
        return [self.levels.host[j][: self.levels.count_before(j, lf)] for j in range(base["level"] + 1, LOD_LEVELS)]

    def _begin_refine(self) -> None:
        base = self._base
        queue = [q for q in self._refine_queue(base) if len(q)]
        self._refinement = {"key": base["key"], "queue": queue, "level": 0, "pos": 0, "drawn": base["drawn"],
                            "left": sum(len(q) for q in queue), "shown": time.perf_counter()}
        self._step_timer.start(0)

    def _refine_step(self) -> None:
        """The next chunk: drawn unseen into the kept picture (no composition of the window),
        shown by a paint every REFINE_SHOW_MS and at the last chunk."""
        r = self._refinement
        if r is None or r["key"] != self._still_key():
            return
        self._step_next = True
        now = time.perf_counter()
        last = self._refine_left() <= self._chunk_points()
        if not last and now - r["shown"] < REFINE_SHOW_MS / 1000.0 and self.canvas.draw_unshown():
            self.unshown_chunks += 1
            return
        r["shown"] = now
        self.canvas.update_now()

    def _draw_chunk(self, key) -> None:
        """The next at most frame-time-target's worth of left-out points, in draw order, drawn
        on top of the picture (indices copied into one small index buffer)."""
        r = self._refinement
        left = self._chunk_points()
        parts = []
        while left > 0 and r["level"] < len(r["queue"]):
            q = r["queue"][r["level"]]
            take = q[r["pos"]: r["pos"] + left]
            parts.append(take)
            left -= len(take)
            r["pos"] += len(take)
            if r["pos"] >= len(q):
                r["level"], r["pos"] = r["level"] + 1, 0
        idx = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
        self._chunk_ibo.set_data(idx)                 # copied by vispy's GLIR queue
        self.cloud.draw_plan = ([(self._chunk_ibo, len(idx))], (0, 0))
        self.canvas.accumulate = True
        self.canvas.refining = True
        self.paint_points = len(idx)
        self.refine_chunks += 1
        self.max_chunk_points = max(self.max_chunk_points, len(idx))
        r["drawn"] += len(idx)
        r["left"] -= len(idx)
        if r["level"] >= len(r["queue"]):             # complete: every point is on screen
            self._refinement = None
            self._full_key = key
            self._set_drawn(self.scene.count)
        else:
            self._set_drawn(r["drawn"])

    def _chunk_points(self) -> int:
        return max(1, int(REFINE_CHUNK_TARGETS * self._point_budget_now()))

    def _refine_left(self) -> int:
        """Points the refinement in progress has still to draw."""
        return 0 if self._refinement is None else self._refinement["left"]

    def _measured(self, ms: float) -> None:
        """After every on-screen draw: the cloud's own draw time per point drawn feeds the
        moving average, then the next refinement chunk is scheduled (a timer: the event loop
        runs between chunks)."""
        if self.measure_cost and self.paint_points > 0 and self.cloud.last_draw_ms is not None:
            c = self.cloud.last_draw_ms / self.paint_points
            self.cost_per_point_ms = c if self.cost_per_point_ms is None else 0.7 * self.cost_per_point_ms + 0.3 * c
        if self._refinement is not None and self.canvas.refining:
            self._step_timer.start(REFINE_PAUSE_MS)
        if self._catch is not None:
            self.canvas.update()                 # the next piece (at the capped redraw rate)

    def _idle_elapsed(self) -> None:
        """The camera and the scene stood still (`_idle_wait_ms`) since the last cleared draw:
        start drawing what it left out, a chunk per draw. Anything changed since that draw
        means a cleared draw is due instead, which restarts the wait."""
        base = self._base
        if base is None or self._refinement is not None or base["key"] != self._still_key():
            return
        self._begin_refine()

    @property
    def refining(self) -> bool:
        """Whether the left-out points are being added to the picture (the view stands still)."""
        return self._refinement is not None

    @property
    def detail_reduced(self) -> bool:
        """Whether the picture on screen shows a subsample of the cloud."""
        return self.detail_fraction < 1.0

    @property
    def detail_text(self) -> str:
        """For the status bar: empty at full detail."""
        if not self.detail_reduced:
            return ""
        pct = f"detail {100 * self.detail_fraction:.0f} %"
        return pct + (", refining" if self.refining else " while moving")

    def _upload_rows(self, lo: int, hi: int) -> None:
        """Upload the scene's rows [lo, hi) into the cloud's buffers, UPLOAD_CHUNK rows at a
        time. Inside a draw each chunk's GL commands are executed at once (`flush_commands`):
        vispy otherwise keeps every queued upload array alive until the draw that follows has
        finished, and after a thinning pass the rewritten tail is millions of rows (~40 B each,
        held for the seconds llvmpipe takes to draw them: the RSS swing of a soak run,
        docs/benchmarks_gui.md). Outside a draw (tests) the chunks queue as before."""
        m = self.scene
        flush = self.canvas._in_pre_draw
        for a in range(lo, hi, UPLOAD_CHUNK):
            s = slice(a, min(hi, a + UPLOAD_CHUNK))
            self.cloud.write_rows(a, m.positions[s], pack_rgb(m.colors[s]), m.conf[s], m.depth[s], m.frame[s],
                                  not flush)     # copy only when the commands wait for a draw
            if flush:
                self.canvas.context.flush_commands()

    def _append_cameras(self, lo: int, hi: int) -> None:
        """Frustum and trajectory lines of cameras [lo, hi): 8 line segments per frustum (apex →
        4 corners, then the image rectangle); non-keyframes at half size and grey so the
        keyframes stand out; the trajectory joins consecutive cameras of a segment."""
        if hi <= lo:
            return
        m = self.scene
        fr = m.cam_frustum[lo:hi].astype(np.float32)
        kf = m.cam_keyframe[lo:hi]
        seg = m.cam_segment[lo:hi]
        fid = m.cam_frame[lo:hi]
        apex, corners = fr[:, :1], fr[:, 1:5]
        # non-keyframes: half size and grey, or collapsed to their apex (invisible) unless
        # every frame's frustum is asked for; one 16-vertex block per camera either way
        corners = np.where(kf[:, None, None], corners,
                           apex + (0.5 if self.all_frustums else 0.0) * (corners - apex))
        lines = np.empty((hi - lo, 16, 3), np.float32)
        lines[:, 0:8:2] = apex
        lines[:, 1:8:2] = corners
        lines[:, 8:16:2] = corners
        lines[:, 9:16:2] = np.roll(corners, -1, axis=1)
        blue, grey = pack_rgb(np.array([[90, 170, 255], [150, 150, 160]]))
        col = np.repeat(np.where(kf, blue, grey).astype(np.float32), 16)
        n = 16 * (hi - lo)
        self.frustums.append(lines.reshape(-1, 3), col, np.full(n, _OVERLAY_CONF, np.float32),
                             np.zeros(n), np.repeat(fid, 16))
        orange = pack_rgb(np.array([[255, 120, 40]]))[0]
        for s in np.unique(seg):
            c = m.cam_center[lo:hi][seg == s]
            ids = fid[seg == s]
            prev = self._last_center.get(int(s))
            if prev is not None:
                c = np.concatenate([prev[0][None], c])
                ids = np.concatenate([[prev[1]], ids])
            self._last_center[int(s)] = (c[-1].copy(), int(ids[-1]))
            if len(c) < 2:
                continue
            # each end of a line is placed by its own camera's frame transform
            pairs = np.stack([c[:-1], c[1:]], 1).reshape(-1, 3)
            pair_ids = np.stack([ids[:-1], ids[1:]], 1).reshape(-1)
            k = len(pairs)
            self.trajectory.append(pairs, np.full(k, orange, np.float32), np.full(k, _OVERLAY_CONF, np.float32),
                                   np.zeros(k), pair_ids)

    def _set_current(self, f) -> None:
        apex, corners = f.frustum[0], f.frustum[1:5]
        lines = np.empty((16, 3), np.float32)
        lines[0:8:2] = apex
        lines[1:8:2] = corners
        lines[8:16:2] = corners
        lines[9:16:2] = np.roll(corners, -1, axis=0)
        self.current.clear()
        self.current.append(lines, np.full(16, pack_rgb(np.array([[255, 220, 0]]))[0], np.float32),
                            np.full(16, _OVERLAY_CONF, np.float32), np.zeros(16), self._last_seq)
        self._last_frame = f

    def apply_realign(self, segment: int, transform: np.ndarray, frames=None) -> None:
        """Place segment `segment` (or only its input frames `frames=(first, last)`) with the
        similarity `transform` — engines send absolute transforms and the latest event covering
        a frame wins, as engine.geometry applies them for the exports. Only the texture rows of
        the frames it covers are rewritten (at the next draw): no point is re-uploaded."""
        self.scene.add_realign(segment, transform, frames)
        self._realigned()

    def apply_events(self, events: Iterable) -> None:
        """Apply the "realign" events of `events` in order (a reopened session's event log)."""
        self.scene.apply_events(events)
        self._realigned()

    def set_segment_transform(self, segment: int, matrix: np.ndarray) -> None:
        self.apply_realign(segment, matrix)

    def _realigned(self) -> None:
        self._dirty = True                  # the texture rows are written at the next draw
        if self.follow and self._last_frame is not None:
            self._follow(self._last_frame)
        self.canvas.update()

    # -- styling (uniforms only: nothing is re-uploaded) -------------------------------------
    def set_conf_threshold(self, value: float) -> None:
        self.cloud.set_uniform("u_conf_min", float(value))
        self.canvas.update()

    def set_point_size(self, px: float) -> None:
        self.cloud.set_uniform("u_size", float(px))
        self.canvas.update()

    def set_color_mode(self, mode: str) -> None:
        if mode not in COLOR_MODES:
            raise ValueError(f"colour mode must be one of {COLOR_MODES}, got {mode!r}")
        self.cloud.set_uniform("u_color_mode", float(COLOR_MODES.index(mode)))
        self.canvas.update()

    def set_show_frustums(self, on: bool) -> None:
        self.frustums.visible = bool(on)
        self._dirty = True             # cameras added while both overlays were hidden
        self.canvas.update()

    def set_all_frustums(self, on: bool) -> None:
        """Draw every frame's frustum (True) or the keyframes' only (False, the default)."""
        if bool(on) == self.all_frustums:
            return
        self.all_frustums = bool(on)
        self._rebuild_cameras = True       # at the next draw
        self._dirty = True
        self.canvas.update()

    def set_show_trajectory(self, on: bool) -> None:
        self.trajectory.visible = bool(on)
        self._dirty = True             # cameras added while both overlays were hidden
        self.canvas.update()

    # -- camera ------------------------------------------------------------------------------
    def set_follow(self, on: bool) -> None:
        self.follow = bool(on)
        if on and self._last_frame is not None:
            self._follow(self._last_frame)

    def _follow(self, f) -> None:
        """Chase view (engine.scene.chase_view): from just behind the current camera."""
        v = chase_view(f.c2w, f.look_at, f.median_depth, self.scene.frame_transform(self._last_seq))
        cam = self.view.camera
        cam.azimuth, cam.elevation = v["azimuth"], v["elevation"]
        cam.center, cam.distance = v["center"], v["distance"]
        self.canvas.update()

    def _on_mouse_press(self, event) -> None:
        self.auto_fit = False          # the user took the camera: stop re-framing

    def reset_view(self) -> None:
        """Look from behind and above the first camera at the middle of the cloud, far enough
        to see it all; keep re-framing as the cloud grows until the user moves the view."""
        self.auto_fit = True
        self._fit(keep_angles=False)

    def _deferred_fit(self) -> None:
        if self.auto_fit and not self.follow:
            self._fit(keep_angles=True)

    def _fit(self, keep_angles: bool) -> None:
        if self._last_frame is None:
            return
        self._fitted = time.perf_counter()
        cam = self.view.camera
        fr = self.scene.framing()
        centre, extent = fr if fr is not None else (np.asarray(self._last_frame.look_at), 1.0)
        cam.center = tuple(float(v) for v in centre)
        cam.distance = max(extent, 1e-3) * 0.85
        if not keep_angles:
            cam.azimuth, cam.elevation = 90.0, 20.0
        self.canvas.update()

    # -- output ------------------------------------------------------------------------------
    def render_image(self) -> np.ndarray:
        """Render the 3D view offscreen → H×W×4 uint8 RGBA."""
        return self.canvas.render()

    def screenshot(self, path: str) -> np.ndarray:
        """Save the 3D view with every point (one full draw: an explicit request)."""
        self.full_render = True
        try:
            img = np.ascontiguousarray(self.render_image())
        finally:
            self.full_render = False
        h, w = img.shape[:2]
        qimg = QtGui.QImage(img.data, w, h, 4 * w, QtGui.QImage.Format.Format_RGBA8888)
        if not qimg.save(str(path)):
            raise OSError(f"could not write screenshot to {path}")
        return img

    def viewer_draws(self) -> int:
        return self.canvas.draws
