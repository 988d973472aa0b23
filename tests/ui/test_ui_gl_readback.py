"""The 3D view's widget (ui/gl_readback.py): Qt paints the window without composing it through
OpenGL, what the screen shows is what the view drew, and the drawn picture follows the widget's
size."""
import numpy as np
from PySide6 import QtGui, QtWidgets

from tests.ui.test_ui_viewer import _frame, _lit
from tests.ui.test_ui_viewer_lod import _screen
from ui.viewer import PointCloudViewer


def _window_with_viewer(qtbot):
    top = QtWidgets.QWidget()
    qtbot.addWidget(top)
    lay = QtWidgets.QHBoxLayout(top)
    lay.setContentsMargins(0, 0, 0, 0)
    v = PointCloudViewer(capacity=1 << 14)
    v.measure_cost, v.cost_per_point_ms = False, 1e-9      # every point in every draw
    lay.addWidget(v, 3)
    label = QtWidgets.QLabel("beside the view")
    lay.addWidget(label, 1)
    top.resize(480, 300)
    top.show()
    qtbot.waitExposed(top)
    return top, v, label


def _draw_and_wait(qtbot, v):
    """Ask for a draw and wait for the paint that does it (and shows it)."""
    n = v.canvas.draws
    v.canvas.update_now()
    qtbot.waitUntil(lambda: v.canvas.draws > n, timeout=10_000)
    qtbot.wait(20)                               # the window system has the flushed picture


def _on_screen(widget):
    """What the display shows of `widget` (read from the window system, not re-drawn)."""
    top = widget.window()
    img = top.screen().grabWindow(top.winId()).toImage().convertToFormat(QtGui.QImage.Format.Format_RGB32)
    arr = np.frombuffer(img.constBits(), np.uint8, count=img.sizeInBytes())
    arr = arr.reshape(img.height(), img.bytesPerLine() // 4, 4)[:, : img.width(), 2::-1]   # 0xffRRGGBB words
    p = widget.mapTo(top, widget.rect().topLeft())
    return arr[p.y(): p.y() + widget.height(), p.x(): p.x() + widget.width()].copy()   # img is freed on return


def test_the_window_is_painted_without_gl_composition(qtbot):
    """A window holding a QOpenGLWidget is composed through OpenGL on every paint (its surface
    becomes an OpenGL one); the view's widget keeps the window a raster one."""
    top, v, label = _window_with_viewer(qtbot)
    v.add_frames([_frame(i, x=0.05 * i) for i in range(4)])
    _draw_and_wait(qtbot, v)
    label.setText("repainted")
    qtbot.wait(20)
    assert top.windowHandle().surfaceType() == QtGui.QSurface.SurfaceType.RasterSurface
    assert v.canvas.native.windowHandle() is None            # no window of its own either


def test_the_screen_shows_what_the_view_drew(qtbot):
    top, v, _ = _window_with_viewer(qtbot)
    v.add_frames([_frame(i, x=0.05 * i) for i in range(4)])
    _draw_and_wait(qtbot, v)
    assert v.drawn_points == v.point_count
    drawn = _screen(v)[..., :3]                  # the view's kept framebuffer
    shown = _on_screen(v.canvas.native)
    assert drawn.shape == shown.shape
    assert _lit(drawn).mean() > 0.02             # points were drawn
    assert np.abs(drawn.astype(int) - shown.astype(int)).max() <= 2   # and shown, the right way up


def test_the_picture_follows_the_widget_size(qtbot):
    top, v, _ = _window_with_viewer(qtbot)
    v.add_frames([_frame(i, x=0.05 * i) for i in range(4)])
    _draw_and_wait(qtbot, v)
    top.resize(640, 420)
    qtbot.waitUntil(lambda: v.canvas.native.width() > 400, timeout=5_000)
    _draw_and_wait(qtbot, v)
    w, h = v.canvas.native.width(), v.canvas.native.height()
    ratio = v.canvas.native.devicePixelRatioF()
    assert tuple(v.canvas.physical_size) == (int(w * ratio), int(h * ratio))
    drawn = _screen(v)[..., :3]
    assert drawn.shape[:2] == (int(h * ratio), int(w * ratio))
    shown = _on_screen(v.canvas.native)
    if ratio == 1.0:
        assert np.abs(drawn.astype(int) - shown.astype(int)).max() <= 2
    assert _lit(shown).mean() > 0.02
