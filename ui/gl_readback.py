"""A vispy canvas backend for the live 3D view that Qt paints like any other widget: vispy draws
into a framebuffer object of ours (on an offscreen surface) and each paint reads it back into an
image that QPainter puts on the widget.

Why not vispy's own Qt backend: it is a QOpenGLWidget, and a window holding one is composed by
Qt through OpenGL on every paint (the window's backing store and the widget's texture drawn as
full-window quads, then a buffer swap). With a software renderer (Mesa llvmpipe: no GPU, VMs,
remote desktops) that composition costs about as much as the view's own reduced draw, on every
redraw; a read-back of the picture and a raster paint cost a fraction of it
(docs/benchmarks_gui.md, "Fourth round"). On a GPU the
read-back is one synchronous copy per redraw; the viewer finishes every draw anyway (it times
them).

The framebuffer object is kept between paints, so a draw may add to the previous picture (the
viewer's refinement chunks); it is re-created, empty, when the widget's size changes.
`makeCurrent`, `doneCurrent` and `isValid` behave as QOpenGLWidget's (makeCurrent binds the
kept framebuffer), so code that reads the picture back (tests) needs nothing else.
"""
from __future__ import annotations

import numpy as np
from PySide6 import QtCore, QtGui, QtWidgets
from PySide6.QtOpenGL import QOpenGLFramebufferObject
from vispy.app.backends import _pyside6  # noqa: F401  (selects PySide6 for vispy's Qt module below)
from vispy.app.backends._qt import QtBaseCanvasBackend, _set_config  # noqa: E402

_GL_BGRA = 0x80E1               # read as BGRA bytes: Qt's 32-bit RGB image layout on little-endian
_GL_UNSIGNED_BYTE = 0x1401


class ReadbackCanvasBackend(QtBaseCanvasBackend, QtWidgets.QWidget):
    """vispy canvas backend: a plain QWidget; the GL context draws offscreen (module docstring)."""

    def _init_specific(self, p, kwargs):
        QtWidgets.QWidget.__init__(self, p.parent)
        fmt = _set_config(p.context.config)
        self._ctx = QtGui.QOpenGLContext()
        self._ctx.setFormat(fmt)
        share = QtGui.QOpenGLContext.globalShareContext()
        if share is not None:
            self._ctx.setShareContext(share)
        if not self._ctx.create():
            raise RuntimeError("could not create an OpenGL context for the 3D view")
        self._surface = QtGui.QOffscreenSurface()
        self._surface.setFormat(self._ctx.format())
        self._surface.create()
        p.context.shared.add_ref("qt-readback", self)
        self._fbo = None
        self._pixels = None             # the read-back picture (bottom row first)
        self._gl_initialized = False
        self.setAttribute(QtCore.Qt.WidgetAttribute.WA_OpaquePaintEvent, True)
        self.setFocusPolicy(QtCore.Qt.FocusPolicy.WheelFocus)
        self._initialized = True

    # -- the QOpenGLWidget-like surface ----------------------------------------------------------
    def isValid(self) -> bool:
        return self._ctx is not None and self._ctx.isValid()

    def makeCurrent(self) -> None:
        """Make the context current and bind the kept framebuffer (re-created at a new size)."""
        self._ctx.makeCurrent(self._surface)
        w, h = (max(1, int(v)) for v in self._vispy_get_physical_size())
        if self._fbo is None or (self._fbo.width(), self._fbo.height()) != (w, h):
            self._fbo = QOpenGLFramebufferObject(
                w, h, QOpenGLFramebufferObject.Attachment.CombinedDepthStencil)
            self._pixels = None
        self._fbo.bind()

    def doneCurrent(self) -> None:
        self._ctx.doneCurrent()

    # -- vispy's backend interface ---------------------------------------------------------------
    def _vispy_set_current(self):
        if self._vispy_canvas is not None and self.isValid():
            self.makeCurrent()

    def _vispy_swap_buffers(self):
        pass                            # nothing to swap: a paint reads the picture back

    def _vispy_get_fb_bind_location(self):
        return self._fbo.handle() if self._fbo is not None else 0

    def _vispy_close(self):
        if self._ctx is not None and self._fbo is not None:
            self._ctx.makeCurrent(self._surface)
            self._fbo = None            # released with the context current
            self._ctx.doneCurrent()
        self.close()

    def screen_changed(self, new_screen):
        self._resized()

    def resizeEvent(self, event):
        self._resized()

    def _resized(self):
        if self._vispy_canvas is None:
            return
        ratio = self.devicePixelRatioF()
        w, h = self.width(), self.height()
        self._vispy_set_physical_size(int(w * ratio), int(h * ratio))
        self._vispy_canvas.events.resize(size=(w, h), physical_size=self._physical_size)

    def paintEvent(self, event):
        """Draw (as QOpenGLWidget's paintGL), then put the picture on the widget."""
        canvas = self._vispy_canvas
        if canvas is None or not self.isValid():
            return
        canvas.set_current()
        if not self._gl_initialized:
            self._gl_initialized = True
            canvas.events.initialize()
        canvas.events.draw(region=None)
        self._paint_picture()

    def _paint_picture(self) -> None:
        fbo = self._fbo
        w, h = fbo.width(), fbo.height()
        if self._pixels is None:
            self._pixels = np.empty((h, w, 4), np.uint8)
        fbo.bind()
        self._ctx.functions().glReadPixels(0, 0, w, h, _GL_BGRA, _GL_UNSIGNED_BYTE, memoryview(self._pixels))
        img = QtGui.QImage(self._pixels.data, w, h, 4 * w, QtGui.QImage.Format.Format_RGB32)
        img.setDevicePixelRatio(self.devicePixelRatioF())
        painter = QtGui.QPainter(self)
        try:
            # GL's first row is the bottom one
            painter.setTransform(QtGui.QTransform(1, 0, 0, -1, 0, self.height()))
            painter.drawImage(QtCore.QPointF(0, 0), img)
        finally:
            painter.end()
