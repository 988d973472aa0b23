"""The preview panes beside the 3D view: the current input frame and its depth map (turbo colours),
each captioned with the frame it shows. Used by the main window and by every second stream view."""
from __future__ import annotations

from typing import Optional

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets

from .display import depth_colours


class _ImageLabel(QtWidgets.QLabel):
    """Shows an RGB array scaled to fit (aspect kept)."""

    def __init__(self, title: str):
        super().__init__()
        self.setAlignment(QtCore.Qt.AlignmentFlag.AlignCenter)
        self.setMinimumSize(160, 120)
        self.setSizePolicy(QtWidgets.QSizePolicy.Policy.Ignored, QtWidgets.QSizePolicy.Policy.Ignored)
        self.setStyleSheet("background: #141518; color: #777;")
        self.setText(title)
        self._img: Optional[QtGui.QImage] = None
        # which frame this pane shows (the two panes may show different frames)
        self.caption = QtWidgets.QLabel(self)
        self.caption.setStyleSheet("background: rgba(20, 21, 24, 190); color: #d8dce2; padding: 1px 4px;")
        self.caption.hide()

    def set_caption(self, text: str) -> None:
        self.caption.setText(text)
        self.caption.adjustSize()
        self.caption.move(2, 2)
        self.caption.setVisible(bool(text))

    def set_rgb(self, rgb: np.ndarray) -> None:
        rgb = np.ascontiguousarray(rgb[:, :, :3], dtype=np.uint8)
        h, w = rgb.shape[:2]
        self._img = QtGui.QImage(rgb.data, w, h, 3 * w, QtGui.QImage.Format.Format_RGB888).copy()
        self._rescale()

    def clear_image(self, title: str) -> None:
        self._img = None
        self.clear()
        self.setText(title)

    def _rescale(self) -> None:
        if self._img is not None:
            self.setPixmap(QtGui.QPixmap.fromImage(self._img).scaled(
                self.size(), QtCore.Qt.AspectRatioMode.KeepAspectRatio,
                QtCore.Qt.TransformationMode.SmoothTransformation))

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self._rescale()


class ImagePreview(QtWidgets.QWidget):
    """The current input frame and its depth map (turbo colours, near = blue), stacked."""

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QtWidgets.QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        self.rgb = _ImageLabel("input frame")
        self.depth = _ImageLabel("depth")
        lay.addWidget(self.rgb, 1)
        lay.addWidget(self.depth, 1)
        self.shown_index = None
        self.depth_shown_index = None

    def show_frame(self, f, note: str = "") -> None:
        """Show a DisplayFrame: its image in the top pane and, when it has one, its depth map in
        the bottom pane; each pane's caption names the frame it shows (a frame without depth
        leaves the last depth map on screen, captioned with its own frame)."""
        if f.image is not None:
            self.rgb.set_rgb(f.image)
            self.shown_index = f.index
            self.rgb.set_caption(f"frame {f.index}" + (" · keyframe" if f.is_keyframe else "") + note)
        if f.depth_map is not None:
            rgb = getattr(f, "depth_rgb", None)
            if rgb is None:
                rgb = depth_colours(f.depth_map)
            if rgb is None:
                return                             # keep the last useful depth map on screen
            self.depth.set_rgb(rgb)
            self.depth_shown_index = f.index
        if self.depth_shown_index is not None:
            same = self.depth_shown_index == self.shown_index
            self.depth.set_caption(f"depth · frame {self.depth_shown_index}")
            self.depth.caption.setToolTip("" if same else "the newest frame with depth "
                                          "(the engine computes depth on keyframes only)")

    def clear(self) -> None:
        self.rgb.clear_image("input frame")
        self.depth.clear_image("depth")
        self.rgb.set_caption("")
        self.depth.set_caption("")
        self.shown_index = None
        self.depth_shown_index = None
