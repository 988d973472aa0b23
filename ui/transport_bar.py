"""The transport toolbar: Start / Pause / Step / Stop, replay speed, loop, the frame to start from
(or jump to), the frame limit, and the run's progress on the right."""
from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from .settings_schema import SPEEDS


class TransportBar(QtWidgets.QToolBar):
    def __init__(self, runs, start, stop, parent=None):
        """`runs`: the RunController (pause, step, seek); `start` / `stop`: the window's Start and
        Stop (argument-free callables)."""
        super().__init__("Transport", parent)
        self.setObjectName("transport")
        self.setMovable(False)
        self.setToolButtonStyle(QtCore.Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        st = self.style()
        SP = QtWidgets.QStyle.StandardPixmap
        self.act_start = self.addAction(st.standardIcon(SP.SP_MediaPlay), "Start", start)
        self.act_start.setToolTip("Start a new reconstruction (resets the scene)")
        self.act_pause = self.addAction(st.standardIcon(SP.SP_MediaPause), "Pause", runs.toggle_pause)
        self.act_step = self.addAction(st.standardIcon(SP.SP_MediaSkipForward), "Step", runs.step)
        self.act_step.setToolTip("Process one frame (starts paused if nothing runs)")
        self.act_stop = self.addAction(st.standardIcon(SP.SP_MediaStop), "Stop", stop)
        self.act_start.setShortcut(QtGui.QKeySequence("Ctrl+Return"))
        self.act_pause.setShortcut(QtGui.QKeySequence("Space"))
        self.act_step.setShortcut(QtGui.QKeySequence("Ctrl+Right"))
        self.act_stop.setShortcut(QtGui.QKeySequence("Ctrl+."))
        self.addSeparator()
        self.addWidget(QtWidgets.QLabel(" Speed "))
        self.speed = QtWidgets.QComboBox()
        for label, val in SPEEDS:
            self.speed.addItem(label, val)
        self.speed.setToolTip("Replay speed for files: as fast as the engine goes, or paced by the video's clock")
        self.addWidget(self.speed)
        self.loop = QtWidgets.QCheckBox("Loop")
        self.loop.setToolTip("Restart files at the end")
        self.addWidget(self.loop)
        self.addSeparator()
        self.addWidget(QtWidgets.QLabel(" Frame "))
        self.seek_spin = QtWidgets.QSpinBox()
        self.seek_spin.setRange(0, 10_000_000)
        self.seek_spin.setToolTip("Frame to start from (or to jump to while running)")
        self.addWidget(self.seek_spin)
        self.act_seek = self.addAction("Go", lambda: runs.seek_to(self.seek_spin.value()))
        self.addSeparator()
        self.addWidget(QtWidgets.QLabel(" Max frames "))
        self.max_frames = QtWidgets.QSpinBox()
        self.max_frames.setRange(0, 10_000_000)
        self.max_frames.setSpecialValueText("all")
        self.max_frames.setToolTip("Stop after this many input frames (all = to the end)")
        self.addWidget(self.max_frames)
        spacer = QtWidgets.QWidget()
        spacer.setSizePolicy(QtWidgets.QSizePolicy.Policy.Expanding, QtWidgets.QSizePolicy.Policy.Preferred)
        self.addWidget(spacer)
        self.progress_label = QtWidgets.QLabel("idle ")
        self.addWidget(self.progress_label)

