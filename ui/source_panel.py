"""Source panel: choose a video file, an image folder or a webcam (index and resolution).

The panel only describes the choice; opening (and every error message about a missing or
unreadable input) happens in the worker through `engine.io.sources.open_source`.
"""
from __future__ import annotations

import os
from typing import Optional

from PySide6 import QtCore, QtWidgets

KINDS = ("video", "folder", "webcam")
_KIND_LABELS = {"video": "Video file", "folder": "Image folder", "webcam": "Webcam"}
VIDEO_FILTER = "Videos (*.mp4 *.avi *.mov *.mkv *.webm *.m4v *.mpg *.mpeg);;All files (*)"
RESOLUTIONS = (None, (640, 480), (1280, 720), (1920, 1080))


class SourcePanel(QtWidgets.QWidget):
    changed = QtCore.Signal()
    message = QtCore.Signal(str)

    def __init__(self, parent: Optional[QtWidgets.QWidget] = None):
        super().__init__(parent)
        form = QtWidgets.QFormLayout(self)
        self.kind = QtWidgets.QComboBox()
        for k in KINDS:
            self.kind.addItem(_KIND_LABELS[k], k)
        self.kind.setToolTip("What to reconstruct from. Video files and folders can also be "
                             "dropped onto the window.")
        form.addRow("Input", self.kind)

        self.path_row = QtWidgets.QWidget()
        h = QtWidgets.QHBoxLayout(self.path_row)
        h.setContentsMargins(0, 0, 0, 0)
        self.path = QtWidgets.QLineEdit()
        self.path.setPlaceholderText("choose or drop a video / image folder")
        self.browse = QtWidgets.QToolButton(text="…")
        self.browse.setToolTip("Browse")
        self.browse.clicked.connect(self._browse)
        h.addWidget(self.path, 1)
        h.addWidget(self.browse)
        form.addRow("Path", self.path_row)

        self.cam_row = QtWidgets.QWidget()
        h = QtWidgets.QHBoxLayout(self.cam_row)
        h.setContentsMargins(0, 0, 0, 0)
        self.webcam = QtWidgets.QComboBox()
        self.webcam.setEditable(True)        # an index can be typed even if probing found none
        self.webcam.setToolTip("Webcam index (/dev/videoN)")
        self.refresh = QtWidgets.QToolButton(text="⟳")
        self.refresh.setToolTip("Look for webcams again")
        self.refresh.clicked.connect(self.refresh_webcams)
        h.addWidget(self.webcam, 1)
        h.addWidget(self.refresh)
        form.addRow("Camera", self.cam_row)
        self.resolution = QtWidgets.QComboBox()
        for r in RESOLUTIONS:
            self.resolution.addItem("camera default" if r is None else f"{r[0]}×{r[1]}", r)
        self.resolution.setToolTip("Capture resolution requested from the webcam; frames are "
                                   "resized for the engine anyway, larger costs decode time.")
        form.addRow("Resolution", self.resolution)
        self._form = form
        self.kind.currentIndexChanged.connect(self._update_rows)
        self.kind.currentIndexChanged.connect(self.changed)
        self.path.textChanged.connect(self.changed)
        self._webcams_probed = False
        self._update_rows()

    def _set_row(self, w: QtWidgets.QWidget, visible: bool) -> None:
        w.setVisible(visible)
        lab = self._form.labelForField(w)
        if lab is not None:
            lab.setVisible(visible)

    def _update_rows(self) -> None:
        cam = self.current_kind() == "webcam"
        self._set_row(self.path_row, not cam)
        self._set_row(self.cam_row, cam)
        self._set_row(self.resolution, cam)
        if cam and not self._webcams_probed:
            self.refresh_webcams()

    def current_kind(self) -> str:
        return self.kind.currentData()

    def refresh_webcams(self) -> list[int]:
        from engine.io.sources import list_webcams
        self._webcams_probed = True
        found = list_webcams()
        current = self.webcam.currentText()
        self.webcam.clear()
        for i in found:
            self.webcam.addItem(str(i))
        if current:
            self.webcam.setCurrentText(current)
        elif not found:
            self.webcam.setEditText("0")
        if not found:
            self.message.emit("No webcam found (you can still type an index)")
        return found

    def _browse(self) -> None:
        start = self.path.text() or os.path.expanduser("~")
        if self.current_kind() == "folder":
            p = QtWidgets.QFileDialog.getExistingDirectory(self, "Choose an image folder", start)
        else:
            p, _ = QtWidgets.QFileDialog.getOpenFileName(self, "Choose a video", start, VIDEO_FILTER)
        if p:
            self.path.setText(p)

    # -- state ---------------------------------------------------------------------------------
    def set_input(self, spec) -> None:
        """Show a source: an int / "webcam:N" / a folder / a file path."""
        s = str(spec)
        if isinstance(spec, int) or s.lower().startswith("webcam:") or (s.isdigit() and not os.path.exists(s)):
            self.kind.setCurrentIndex(KINDS.index("webcam"))
            self.webcam.setEditText(s.split(":", 1)[-1])
            return
        self.kind.setCurrentIndex(KINDS.index("folder" if os.path.isdir(s) else "video"))
        self.path.setText(s)

    def spec(self):
        """The spec for engine.io.sources.open_source (str path or "webcam:N")."""
        if self.current_kind() == "webcam":
            return f"webcam:{self.webcam.currentText().strip() or '0'}"
        return self.path.text().strip()

    def webcam_resolution(self):
        return self.resolution.currentData() if self.current_kind() == "webcam" else None

    def state(self) -> dict:
        return {"kind": self.current_kind(), "path": self.path.text(), "webcam": self.webcam.currentText(),
                "resolution": self.resolution.currentIndex()}

    def restore(self, st: dict) -> None:
        if not isinstance(st, dict):
            return
        if st.get("kind") in KINDS and st.get("kind") != "webcam":   # never probe cameras at start
            self.kind.setCurrentIndex(KINDS.index(st["kind"]))
        self.path.setText(str(st.get("path", "")))
        if st.get("webcam"):
            self.webcam.setEditText(str(st["webcam"]))
        if isinstance(st.get("resolution"), int) and 0 <= st["resolution"] < self.resolution.count():
            self.resolution.setCurrentIndex(st["resolution"])
