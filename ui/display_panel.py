"""The "Display" group of the controls dock: how the 3D view draws (confidence threshold, point
size, colours, Subsample, frustums, trajectory, follow camera, point budget).

Every widget takes its range and its default from ui/settings_schema.py (the one place display
defaults live); `sync_viewer` then pushes the widgets' values into the viewer, so the view never
starts in a state its controls do not show (a checkbox already at its value emits no `toggled`).
"""
from __future__ import annotations

import numpy as np
from PySide6 import QtCore, QtWidgets

from .review_confidence import ConfidenceControl
from .settings_schema import COLOR_MODES, KEYS, default


class DisplayPanel(QtWidgets.QWidget):
    thresholdChanged = QtCore.Signal()        # the minimum confidence moved (status, exports)
    strideChanged = QtCore.Signal(int)        # Subsample (applies to the next run / reopen)
    screenshotRequested = QtCore.Signal()

    def __init__(self, viewer, parent=None):
        super().__init__(parent)
        self.viewer = viewer
        form = QtWidgets.QFormLayout(self)
        # absolute confidence units (engine.confidence), with the distribution under the slider
        self.conf_control = ConfidenceControl()
        form.addRow("Min confidence", self.conf_control)
        self.point_size = QtWidgets.QDoubleSpinBox()
        self.point_size.setSingleStep(0.5)
        self.point_size.setSuffix(" px")
        form.addRow("Point size", self.point_size)
        self.color_mode = QtWidgets.QComboBox()
        self.color_mode.addItems([m.capitalize() if m != "rgb" else "RGB" for m in COLOR_MODES])
        form.addRow("Colour", self.color_mode)
        self.stride = QtWidgets.QSpinBox()
        self.stride.setToolTip("Keep every N-th pixel of each frame (next run / reopen; also used by exports)")
        form.addRow("Subsample", self.stride)
        checks = QtWidgets.QWidget()
        g = QtWidgets.QGridLayout(checks)
        g.setContentsMargins(0, 0, 0, 0)
        self.show_frustums = QtWidgets.QCheckBox("Frustums")
        self.show_traj = QtWidgets.QCheckBox("Trajectory")
        self.follow = QtWidgets.QCheckBox("Follow camera")
        self.all_frustums = QtWidgets.QCheckBox("Every frame")
        self.all_frustums.setToolTip("Draw a frustum for every frame, not only the keyframes")
        for i, w in enumerate((self.show_frustums, self.show_traj, self.follow, self.all_frustums)):
            g.addWidget(w, i // 2, i % 2)
        form.addRow(checks)
        btns = QtWidgets.QWidget()
        h = QtWidgets.QHBoxLayout(btns)
        h.setContentsMargins(0, 0, 0, 0)
        reset = QtWidgets.QPushButton("Reset view")
        reset.clicked.connect(viewer.reset_view)
        shot = QtWidgets.QPushButton("Screenshot…")
        shot.clicked.connect(self.screenshotRequested)
        h.addWidget(reset)
        h.addWidget(shot)
        form.addRow(btns)
        self.point_budget = QtWidgets.QDoubleSpinBox()
        self.point_budget.setDecimals(1)
        self.point_budget.setSingleStep(1.0)
        self.point_budget.setSuffix(" M points")
        self.point_budget.setKeyboardTracking(False)   # typing "10" must not thin to 1 M on the way
        self.point_budget.setToolTip(
            "Most points the 3D view keeps (each takes ~28 bytes of GPU memory and ~30 of RAM). "
            "Past it, older frames are thinned to a voxel grid (keyframes finer, recent frames "
            "dense), so long runs stay flat in memory. Exports always use every stored frame.")
        form.addRow("Point budget", self.point_budget)

        self.apply_defaults()
        self.conf_control.changed.connect(self.apply_threshold)
        self.point_size.valueChanged.connect(viewer.set_point_size)
        self.color_mode.currentIndexChanged.connect(lambda i: viewer.set_color_mode(COLOR_MODES[i]))
        self.show_frustums.toggled.connect(viewer.set_show_frustums)
        self.show_traj.toggled.connect(viewer.set_show_trajectory)
        self.all_frustums.toggled.connect(viewer.set_all_frustums)
        self.follow.toggled.connect(viewer.set_follow)
        self.point_budget.valueChanged.connect(lambda v: viewer.set_point_budget(int(v * 1e6)))
        self.stride.valueChanged.connect(self.strideChanged)
        self.sync_viewer()

    def apply_defaults(self) -> None:
        """Ranges and values from their declarations in ui/settings_schema.py."""
        for spin, key, scale in ((self.point_size, "display/point_size", 1.0), (self.stride, "display/stride", 1),
                                 (self.point_budget, "display/point_budget", 1e-6)):
            lo, hi = KEYS[key].range
            spin.setRange(lo * scale, hi * scale)
            spin.setValue(default(key) * scale)
        self.color_mode.setCurrentIndex(COLOR_MODES.index(default("display/color_mode")))
        for box, key in ((self.show_frustums, "display/frustums"), (self.show_traj, "display/trajectory"),
                         (self.follow, "display/follow"), (self.all_frustums, "display/all_frustums")):
            box.setChecked(default(key))
        self.set_threshold(default("display/conf_threshold"))

    def sync_viewer(self) -> None:
        """The viewer's state from the widgets (after construction; signals carry later changes)."""
        v = self.viewer
        v.set_point_size(self.point_size.value())
        v.set_color_mode(COLOR_MODES[self.color_mode.currentIndex()])
        v.set_show_frustums(self.show_frustums.isChecked())
        v.set_show_trajectory(self.show_traj.isChecked())
        v.set_all_frustums(self.all_frustums.isChecked())
        v.set_follow(self.follow.isChecked())
        v.set_point_budget(int(self.point_budget.value() * 1e6))
        self.apply_threshold()

    def threshold(self) -> float:
        """The minimum confidence in the engine's absolute units (−inf = show everything)."""
        return self.conf_control.threshold()

    def set_threshold(self, t: float) -> None:
        """Set the minimum confidence (absolute units; None, 0 or −inf = all points)."""
        self.conf_control.set_threshold(t)

    def apply_threshold(self, *_) -> None:
        t = self.threshold()
        self.viewer.set_conf_threshold(t if np.isfinite(t) else -3.0e38)
        self.thresholdChanged.emit()
