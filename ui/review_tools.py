"""The review tools under the timeline: Crop box, Crop polygon, Remove outliers, Set scale, Set floor,
Ground truth, Reset edits. Everything they compute is engine code (engine.io.edits,
engine.io.session_reader, engine.ground_truth); this module only wires widgets and draws overlays.

Edits are saved with the session (engine.io.edits: `edits.json` beside it, atomically) the moment
one is applied, and every export reads them (engine.io.session_reader). The view shows what the
exports hold: the timeline's frames are drawn through `ReviewBar.display_filter`, which keeps
the points the edits keep, in the session's own world (crops and picks are made there; the floor
and the metric scale only move the exports). Once a metric scale is set the measure tool reads
metres.

Picking reuses the measure tool's pick (`ReviewBar.pick_point`: the front-most drawn point near
the click); a polygon's corners are screen positions, stored with the view's projection.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np
from PySide6 import QtCore, QtWidgets
from vispy import scene as vscene

from engine.api import EngineError
from engine.geometry import apply_to_points
from engine.io.edits import (BoxCrop, EditsError, OutlierRemoval, PolygonCrop, SessionEdits, floor_from_points,
                             floor_grid, load_edits, save_edits, scale_from_points)

TOOLS = ("Crop box", "Crop polygon", "Remove outliers", "Set scale", "Set floor", "Ground truth", "Reset edits")
BOX_COLOR = (1.0, 0.85, 0.2, 1.0)
POLYGON_COLOR = (0.2, 1.0, 0.6, 1.0)
FLOOR_COLOR = (0.55, 0.75, 1.0, 0.8)
REFERENCE_COLOR = (1.0, 1.0, 1.0, 1.0)


class ReviewTools(QtWidgets.QWidget):
    """See the module docstring. `review` is the ReviewBar (viewer, window, timeline, picks)."""

    editsChanged = QtCore.Signal()

    def __init__(self, review, parent=None):
        super().__init__(parent)
        self.review = review
        self.viewer = review.viewer
        self.folder: Optional[str] = None
        self.edits = SessionEdits()
        self.mode: Optional[str] = None          # the tool taking clicks: polygon / scale / floor
        self.picks: list = []                    # world points (scale, floor) or screen points (polygon)
        self.box: Optional[BoxCrop] = None       # the box being edited
        self.reader = None                       # engine.io.session_reader.FrameReader with the edits
        self.ground_truth = None                 # engine.ground_truth.GroundTruthOverlay on screen
        self.ground_truth_file: Optional[str] = None

        self.buttons: dict[str, QtWidgets.QAbstractButton] = {}
        row = QtWidgets.QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(4)
        row.addWidget(QtWidgets.QLabel("Edit"))
        tips = {
            "Crop box": "Keep the points inside a box (its bounds below); exports keep the same",
            "Crop polygon": "Click the corners of a polygon on the view, then keep or remove what is inside",
            "Remove outliers": "Statistical outlier removal: points far from their k nearest neighbours",
            "Set scale": "Click two points and give their real distance: exports and the measure tool in metres",
            "Set floor": "Click three points on the floor: exports put it at y = 0, up = -y",
            "Ground truth": "Show a reference trajectory (TUM) aligned by Sim(3), the path coloured by its error",
            "Reset edits": "Forget every edit of this session (its recorded data is never changed)",
        }
        for name in TOOLS:
            if name == "Ground truth":       # its arrow: choose another reference file
                b = QtWidgets.QToolButton()
                b.setText(name)
                b.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.MenuButtonPopup)
                menu = QtWidgets.QMenu(b)
                menu.addAction("Reference trajectory file (TUM)…", self.choose_ground_truth)
                b.setMenu(menu)
            else:
                b = QtWidgets.QPushButton(name)
            b.setToolTip(tips[name])
            b.setCheckable(name in ("Crop box", "Crop polygon", "Remove outliers", "Set scale", "Set floor",
                                    "Ground truth"))
            b.setEnabled(False)
            b.clicked.connect(lambda checked, n=name: self._on_button(n, checked))
            row.addWidget(b)
            self.buttons[name] = b
        self.status = QtWidgets.QLabel("")
        self.status.setStyleSheet("color: #8a8f98;")
        row.addWidget(self.status, 1)

        # the options of the active tool, in one row under the buttons
        self.options = QtWidgets.QStackedWidget()
        self.options.addWidget(QtWidgets.QWidget())                 # 0: nothing
        self.box_lo = [self._spin() for _ in range(3)]
        self.box_hi = [self._spin() for _ in range(3)]
        box = QtWidgets.QWidget()
        bl = QtWidgets.QGridLayout(box)                              # bounds, then the actions
        bl.setContentsMargins(0, 0, 0, 0)
        bl.setHorizontalSpacing(4)
        for col, (axis, lo, hi) in enumerate(zip("xyz", self.box_lo, self.box_hi)):
            bl.addWidget(QtWidgets.QLabel(axis), 0, 3 * col)
            bl.addWidget(lo, 0, 3 * col + 1)
            bl.addWidget(hi, 0, 3 * col + 2)
            for sp in (lo, hi):
                sp.valueChanged.connect(self._box_from_spins)
        self.box_apply = QtWidgets.QPushButton("Keep inside")
        self.box_apply.clicked.connect(lambda: self.apply_box(keep_inside=True))
        self.box_remove = QtWidgets.QPushButton("Remove inside")
        self.box_remove.clicked.connect(lambda: self.apply_box(keep_inside=False))
        actions = QtWidgets.QHBoxLayout()
        actions.addWidget(QtWidgets.QLabel("box bounds (min, max)"))
        actions.addStretch(1)
        actions.addWidget(self.box_apply)
        actions.addWidget(self.box_remove)
        bl.addLayout(actions, 1, 0, 1, 9)
        self.options.addWidget(box)                                 # 1: box
        poly = QtWidgets.QWidget()
        pl = QtWidgets.QHBoxLayout(poly)
        pl.setContentsMargins(0, 0, 0, 0)
        self.poly_keep = QtWidgets.QPushButton("Keep inside")
        self.poly_keep.clicked.connect(lambda: self.apply_polygon(keep_inside=True))
        self.poly_remove = QtWidgets.QPushButton("Remove inside")
        self.poly_remove.clicked.connect(lambda: self.apply_polygon(keep_inside=False))
        pl.addWidget(QtWidgets.QLabel("Click the polygon's corners on the view, then"))
        pl.addWidget(self.poly_keep)
        pl.addWidget(self.poly_remove)
        pl.addStretch(1)
        self.options.addWidget(poly)                                # 2: polygon
        out = QtWidgets.QWidget()
        ol = QtWidgets.QHBoxLayout(out)
        ol.setContentsMargins(0, 0, 0, 0)
        self.outlier_k = QtWidgets.QSpinBox()
        self.outlier_k.setRange(2, 200)
        self.outlier_k.setValue(OutlierRemoval.k)
        self.outlier_k.setToolTip("Neighbours each point is compared with")
        self.outlier_ratio = QtWidgets.QDoubleSpinBox()
        self.outlier_ratio.setRange(0.1, 20.0)
        self.outlier_ratio.setSingleStep(0.5)
        self.outlier_ratio.setValue(OutlierRemoval.std_ratio)
        self.outlier_ratio.setToolTip("A point is removed when its mean neighbour distance exceeds the mean by "
                                      "this many standard deviations")
        self.outlier_apply = QtWidgets.QPushButton("Remove")
        self.outlier_apply.clicked.connect(self.apply_outliers)
        for w in (QtWidgets.QLabel("neighbours"), self.outlier_k, QtWidgets.QLabel("std ratio"), self.outlier_ratio,
                  self.outlier_apply):
            ol.addWidget(w)
        ol.addStretch(1)
        self.options.addWidget(out)                                 # 3: outliers
        sc = QtWidgets.QWidget()
        sl = QtWidgets.QHBoxLayout(sc)
        sl.setContentsMargins(0, 0, 0, 0)
        self.scale_length = QtWidgets.QDoubleSpinBox()
        self.scale_length.setRange(0.0, 1e6)
        self.scale_length.setDecimals(4)
        self.scale_length.setValue(1.0)
        self.scale_length.setSuffix(" m")
        self.scale_apply = QtWidgets.QPushButton("Set")
        self.scale_apply.clicked.connect(self.apply_scale)
        for w in (QtWidgets.QLabel("Click two points; their real distance"), self.scale_length, self.scale_apply):
            sl.addWidget(w)
        sl.addStretch(1)
        self.options.addWidget(sc)                                  # 4: scale
        # floated over the bottom of the 3D view (as its hint): showing it never resizes the view,
        # so screen positions clicked and the projection stored with a polygon stay the same
        self.options.setParent(self.viewer)
        self.options.setObjectName("reviewToolOptions")
        self.options.setAttribute(QtCore.Qt.WidgetAttribute.WA_StyledBackground, True)
        self.options.setStyleSheet("#reviewToolOptions { background: rgba(27, 29, 34, 230); border-radius: 4px; } "
                                   "#reviewToolOptions QLabel { color: #d0d4da; }")
        self.options.setVisible(False)
        self.viewer.installEventFilter(self)

        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(row)

        # overlays: drawn over the cloud, in the session's world (the polygon in screen pixels)
        vs = self.viewer.view.scene
        self.box_lines = vscene.visuals.Line(color=BOX_COLOR, width=2, connect="segments", parent=vs)
        self.floor_lines = vscene.visuals.Line(color=FLOOR_COLOR, width=1, connect="segments", parent=vs)
        self.reference_line = vscene.visuals.Line(color=REFERENCE_COLOR, width=2, parent=vs)
        self.error_line = vscene.visuals.Line(width=4, parent=vs)
        self.polygon_line = vscene.visuals.Line(color=POLYGON_COLOR, width=2, parent=self.viewer.canvas.scene)
        for v in (self.box_lines, self.floor_lines, self.reference_line, self.error_line, self.polygon_line):
            v.set_gl_state(depth_test=False, blend=True)
            v.order = 15
            v.visible = False
        self.polygon_line.order = 30

    def eventFilter(self, obj, event) -> bool:
        if obj is self.viewer and event.type() == QtCore.QEvent.Type.Resize:
            self._place_options()
        return False

    def _place_options(self) -> None:
        page = self.options.currentWidget()
        hint = page.sizeHint() if page is not None else self.options.sizeHint()
        w = min(max(hint.width() + 12, 200), self.viewer.width() - 16)
        self.options.setGeometry(8, max(0, self.viewer.height() - hint.height() - 20), w, hint.height() + 12)
        self.options.raise_()

    @staticmethod
    def _spin() -> QtWidgets.QDoubleSpinBox:
        s = QtWidgets.QDoubleSpinBox()
        s.setRange(-1e6, 1e6)
        s.setDecimals(3)
        s.setSingleStep(0.05)
        s.setKeyboardTracking(False)
        s.setMaximumWidth(76)
        return s

    # -- session --------------------------------------------------------------------------------
    def set_session(self, folder: Optional[str]) -> None:
        """A session was opened (None: closed): its stored edits, drawn at once."""
        self._end_mode()
        self.folder = folder
        self.reader = None
        self.edits = SessionEdits()
        self.clear_ground_truth()
        self.ground_truth_file = None
        for b in self.buttons.values():
            b.setEnabled(bool(folder))
        if not folder:
            self.status.setText("")
            return
        try:
            self.edits = load_edits(folder)
        except EditsError as exc:             # kept on disk: a new edit moves it aside, never loses it
            self.review.window.show_message(f"{exc}; the session is shown without its edits", "warning")
        self._show_floor()
        self._update_status()
        if not self.edits.empty:
            self.refresh_view()

    def _update_status(self) -> None:
        e, parts = self.edits, []
        if e.crops:
            parts.append(f"{len(e.crops)} crop" + ("s" if len(e.crops) > 1 else ""))
        if e.outliers is not None:
            parts.append("outliers removed")
        if e.scale is not None:
            parts.append(f"scale ×{e.scale_factor:.4g} (m)")
        if e.floor is not None:
            parts.append("floor set")
        if self.ground_truth is not None:
            parts.append(f"ATE {100 * self.ground_truth.rmse_m:.2f} cm over {len(self.ground_truth.indices)} frames")
        self.status.setText(" · ".join(parts))
        self.buttons["Reset edits"].setEnabled(bool(self.folder) and not e.empty)

    def _save(self, edits: SessionEdits, what: str) -> bool:
        """Store the new edits with the session and redraw; False (and a message) if they cannot be."""
        from engine.io.edits import edits_path
        p = edits_path(self.folder)
        try:
            if p.exists():
                try:
                    load_edits(self.folder)
                except EditsError:            # an unreadable file the user may want back: moved aside
                    p.replace(p.with_name(p.name + ".unreadable"))
            save_edits(self.folder, edits)
        except (EngineError, OSError) as exc:
            self.review.window.show_message(f"{what} not saved: {exc}")
            return False
        self.edits = edits
        self.reader = None
        self._update_status()
        self._show_floor()
        self.refresh_view()
        self.review.window.show_message(f"{what}: saved with the session; exports apply it", "info")
        self.editsChanged.emit()
        return True

    # -- what the view shows ------------------------------------------------------------------
    def session_reader(self):
        """engine.io.session_reader.FrameReader of the session with the current edits."""
        if self.reader is None and self.folder:
            from engine.io.session_reader import read_session
            self.reader = read_session(self.folder, edits=self.edits)
            self._placement = {p.index: p.transform for p in self.reader.placed}
        return self.reader

    def display_filter(self, d):
        """The DisplayFrame `d` with only the points the edits keep (ReviewBar.display_filter)."""
        if not self.edits.removes_points or not len(d.points):
            return d
        reader = self.session_reader()
        placed = self._placement
        T = placed.get(d.index)
        if T is None and d.index not in placed:          # a frame stored after the reader was made
            from engine.geometry import result_transforms
            T = result_transforms([(d.segment, d.index)], reader.events)[0]
        world = d.points if T is None else apply_to_points(T, d.points)
        keep = reader.keep_mask(world)
        if keep.all():
            return d
        return dataclasses.replace(d, points=d.points[keep], colors=d.colors[keep], conf=d.conf[keep],
                                   depth=d.depth[keep])

    def refresh_view(self) -> None:
        """Draw the session again through the edits (the timeline position is kept)."""
        rv = self.review
        if rv.timeline is None and rv.window.session_folder:
            rv.set_session(rv.window.session_folder)
        if rv.timeline is None or not rv.timeline.refresh():
            return
        rv._display_cache.clear()
        rv._cached_points = 0
        reviewing, upto = rv.reviewing, rv.shown_upto
        rv.shown_upto = None                               # a full redraw, not an incremental one
        cam = self.viewer.view.camera                      # the view stays where the user put it
        state = (cam.center, cam.distance, cam.azimuth, cam.elevation)
        self.viewer.auto_fit = False
        QtWidgets.QApplication.setOverrideCursor(QtCore.Qt.CursorShape.WaitCursor)
        try:
            if reviewing and upto is not None:
                rv.scrub_to(upto)
            else:
                rv.scrub_to(rv.timeline.indices[-1], mode="accumulated")
                if not getattr(rv.window, "running", False):   # a running reconstruction: the view
                    rv.shown_upto = None                        # stays on the edited timeline (Live
                    rv._set_reviewing(False)                    # draws the raw run again)
        finally:
            QtWidgets.QApplication.restoreOverrideCursor()
            cam.center, cam.distance, cam.azimuth, cam.elevation = state
            self.viewer.canvas.update()

    def distance_text(self, d: float) -> str:
        """The measure tool's reading: metres once a metric scale is set."""
        if self.edits.scale is not None:
            return f"distance {d * self.edits.scale_factor:.3f} m"
        return f"distance {d:.3g}"

    # -- buttons ------------------------------------------------------------------------------
    def _on_button(self, name: str, checked: bool) -> None:
        if name == "Reset edits":
            self.reset_edits()
            return
        if name == "Ground truth":
            if checked:
                self.show_ground_truth()
            else:
                self.clear_ground_truth()
            return
        if not checked:
            self._end_mode()
            return
        self.start(name)

    def start(self, name: str) -> None:
        """Enter a tool's mode (the others end)."""
        self._end_mode(keep=name)
        self.buttons[name].setChecked(True)
        self.mode = name
        self.picks = []
        if self.review.measure.isChecked():
            self.review.measure.setChecked(False)
        page = {"Crop box": 1, "Crop polygon": 2, "Remove outliers": 3, "Set scale": 4}.get(name, 0)
        self.options.setCurrentIndex(page)
        self._place_options()
        self.options.setVisible(page != 0)
        if name == "Crop box":
            self._start_box()
        elif name == "Set floor":
            self.review.info.setText("click three points on the floor")
        elif name == "Set scale":
            self.review.info.setText("click two points")
        elif name == "Remove outliers":
            t = self.review.window.conf_threshold()
            self.review.info.setText("statistics of the points shown" + (f" (confidence ≥ {t:g})"
                                                                         if np.isfinite(t) else ""))

    def _end_mode(self, keep: Optional[str] = None) -> None:
        for n, b in self.buttons.items():
            if n != keep and n != "Ground truth" and b.isCheckable():
                b.setChecked(False)
        self.mode = None
        self.picks = []
        self.box = None
        self.box_lines.visible = False
        self.polygon_line.visible = False
        self.options.setCurrentIndex(0)
        self.options.setVisible(False)
        self.review._clear_measure()
        self.viewer.canvas.update()

    def click(self, pos) -> bool:
        """A click on the view while a picking tool is active (True: the tool took it)."""
        if self.mode == "Crop polygon":
            if not self.picks:                # the projection the corners are clicked in
                self._polygon_view = (self.polygon_view(), tuple(int(v) for v in self.viewer.canvas.size))
            self.picks.append(np.asarray(pos[:2], np.float64))
            pts = np.array(self.picks + [self.picks[0]], np.float32)
            self.polygon_line.set_data(pts, color=POLYGON_COLOR)
            self.polygon_line.visible = True
            self.review.info.setText(f"{len(self.picks)} corners")
            self.viewer.canvas.update()
            return True
        if self.mode in ("Set scale", "Set floor"):
            p = self.review.pick_point(pos)
            if p is None:
                return True
            need = 2 if self.mode == "Set scale" else 3
            if len(self.picks) >= need:
                self.picks = []
            self.picks.append(p)
            self.review.add_measure_point(p) if self.mode == "Set scale" else self._mark(self.picks)
            if self.mode == "Set floor":
                self.review.info.setText(f"{len(self.picks)} of 3 floor points")
                if len(self.picks) == 3:
                    self.apply_floor()
            return True
        return False

    def _mark(self, points) -> None:
        m = self.review._markers
        m.set_data(np.array(points, np.float32), face_color=(0.4, 0.8, 1.0, 1.0), size=9, edge_width=0)
        m.visible = True
        self.viewer.canvas.update()

    # -- the tools ----------------------------------------------------------------------------
    def _floor_rotation(self) -> Optional[np.ndarray]:
        """With a floor set, boxes are aligned with it (world = rotation @ local)."""
        return None if self.edits.floor is None else self.edits.floor.transform[:3, :3].T

    def _shown_points(self) -> np.ndarray:
        m = self.viewer.scene
        world = m.world_positions()
        t = self.review.window.conf_threshold()
        return world[m.conf[: m.count] >= t] if np.isfinite(t) else world

    def _start_box(self) -> None:
        pts = self._shown_points()
        if not len(pts):
            self.review.info.setText("no points to crop")
            return
        self.set_box(BoxCrop.around(pts, self._floor_rotation()))

    def set_box(self, box: BoxCrop) -> None:
        """The box being edited (drawn; its bounds in the spin boxes)."""
        self.box = box
        lo, hi = box.bounds()
        for s, v in zip(self.box_lo + self.box_hi, list(lo) + list(hi)):
            s.blockSignals(True)
            s.setValue(float(v))
            s.blockSignals(False)
        self.box_lines.set_data(box.edges().astype(np.float32), color=BOX_COLOR, connect="segments")
        self.box_lines.visible = True
        self.viewer.canvas.update()

    def _box_from_spins(self, *_) -> None:
        if self.box is None:
            return
        lo = [s.value() for s in self.box_lo]
        hi = [s.value() for s in self.box_hi]
        self.set_box(BoxCrop.from_bounds(np.minimum(lo, hi), np.maximum(lo, hi), self.box.rotation))

    def apply_box(self, keep_inside: bool = True) -> bool:
        if self.box is None:
            return False
        box = dataclasses.replace(self.box, keep_inside=keep_inside)
        ok = self._save(dataclasses.replace(self.edits, crops=self.edits.crops + [box]), "Crop box")
        self._end_mode()
        return ok

    def polygon_view(self) -> np.ndarray:
        """4x4 world -> homogeneous canvas pixels of the current view (what `project` applies)."""
        tr = self.viewer.view.scene.node_transform(self.viewer.canvas.scene)
        return np.asarray(tr.map(np.eye(4)), np.float64).T       # vispy maps row vectors

    def apply_polygon(self, keep_inside: bool = True) -> bool:
        if len(self.picks) < 3:
            self.review.info.setText("a polygon needs at least three corners")
            return False
        view, size = self._polygon_view
        crop = PolygonCrop(view=view, polygon=np.array(self.picks, np.float64), size=size, keep_inside=keep_inside)
        ok = self._save(dataclasses.replace(self.edits, crops=self.edits.crops + [crop]), "Crop polygon")
        self._end_mode()
        return ok

    def apply_outliers(self) -> bool:
        t = self.review.window.conf_threshold()
        params = OutlierRemoval(k=int(self.outlier_k.value()), std_ratio=float(self.outlier_ratio.value()),
                                conf_threshold=float(t) if np.isfinite(t) else 0.0)
        ok = self._save(dataclasses.replace(self.edits, outliers=params), "Remove outliers")
        self._end_mode()
        return ok

    def apply_scale(self) -> bool:
        if len(self.picks) != 2:
            self.review.info.setText("click two points first")
            return False
        try:
            scale = scale_from_points(self.picks[0], self.picks[1], self.scale_length.value())
        except EditsError as exc:
            self.review.window.show_message(str(exc))
            return False
        ok = self._save(dataclasses.replace(self.edits, scale=scale), "Metric scale")
        self._end_mode()
        return ok

    def apply_floor(self) -> bool:
        m = self.viewer.scene
        toward = m.camera_centers().mean(axis=0) if m.camera_count else None
        try:
            floor = floor_from_points(*self.picks[:3], toward=toward)
        except EditsError as exc:
            self.review.window.show_message(str(exc))
            self.picks = []
            return False
        ok = self._save(dataclasses.replace(self.edits, floor=floor), "Floor")
        self._end_mode()
        return ok

    def _show_floor(self) -> None:
        f = self.edits.floor
        pts = self._shown_points() if f is not None else None
        if f is None or pts is None or not len(pts):
            self.floor_lines.visible = False
            return
        centre = np.median(pts, axis=0)
        extent = float(np.percentile(np.linalg.norm(pts - centre, axis=1), 90))
        self.floor_lines.set_data(floor_grid(f, centre, max(extent, 1e-3)).astype(np.float32), color=FLOOR_COLOR,
                                  connect="segments")
        self.floor_lines.visible = True
        self.viewer.canvas.update()

    def reset_edits(self, confirm: bool = True) -> bool:
        if self.edits.empty or not self.folder:
            return False
        if confirm:
            answer = QtWidgets.QMessageBox.question(
                self, "Reset edits?", "Forget the crops, outlier removal, floor and scale of this session?\n"
                "(The recorded session itself is never changed.)")
            if answer != QtWidgets.QMessageBox.StandardButton.Yes:
                return False
        self._end_mode()
        return self._save(SessionEdits(), "Edits reset")

    # -- ground truth -------------------------------------------------------------------------
    def show_ground_truth(self, path: Optional[str] = None) -> bool:
        """Draw the reference trajectory beside the run: `path`, else the one the session names
        or sits beside (engine.ground_truth.find_ground_truth), else ask for a TUM file."""
        from engine.ground_truth import GroundTruthError, error_colors, find_ground_truth, ground_truth_overlay
        b = self.buttons["Ground truth"]
        reader = self.session_reader()
        if reader is None:
            b.setChecked(False)
            return False
        path = path or self.ground_truth_file or find_ground_truth(reader.folder, reader.info)
        if path is None:
            path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Reference trajectory (TUM: t tx ty tz qx qy qz qw)",
                                                            "", "TUM trajectory (*.txt *.tum);;All files (*)")
            if not path:
                b.setChecked(False)
                return False
        placed = reader.placed
        try:
            ov = ground_truth_overlay([p.index for p in placed], [p.timestamp for p in placed],
                                      np.array([p.c2w for p in placed]), path)
        except GroundTruthError as exc:
            self.review.window.show_message(str(exc))
            b.setChecked(False)
            return False
        self.ground_truth, self.ground_truth_file = ov, str(path)
        self.reference_line.set_data(ov.reference.astype(np.float32), color=REFERENCE_COLOR)
        cols = np.concatenate([error_colors(ov.errors_m) / 255.0, np.ones((len(ov.errors_m), 1))], 1)
        self.error_line.set_data(ov.estimated.astype(np.float32), color=cols.astype(np.float32))
        self.reference_line.visible = self.error_line.visible = True
        b.setChecked(True)
        b.setToolTip(f"Reference {path} ({ov.association} matched), aligned by Sim(3); the run's path is "
                     f"green (no error) to red ({100 * ov.errors_m.max():.1f} cm)")
        self._update_status()
        self.viewer.canvas.update()
        self.review.window.show_message(f"Ground truth: ATE {100 * ov.rmse_m:.2f} cm over {len(ov.indices)} frames "
                                        f"after Sim(3) alignment ({Path(str(path)).name})", "info")
        return True

    def choose_ground_truth(self) -> bool:
        """Ask for a TUM file and show it as the reference."""
        path, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Reference trajectory (TUM: t tx ty tz qx qy qz qw)",
                                                        "", "TUM trajectory (*.txt *.tum);;All files (*)")
        return bool(path) and self.show_ground_truth(path)

    def clear_ground_truth(self) -> None:
        self.ground_truth = None
        self.reference_line.visible = self.error_line.visible = False
        self.buttons["Ground truth"].setChecked(False)
        self._update_status()
        self.viewer.canvas.update()
