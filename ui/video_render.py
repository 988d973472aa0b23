"""The video export's renderer (engine/io/video.py draws nothing itself): the point cloud and the
trajectory in an offscreen vispy SceneCanvas, whose camera is one clip matrix per frame.

GL context: the vispy application already running in the process (the GUI's Qt one), else EGL:
under X (e.g. Xvfb) through the display, without one "surfaceless" (Mesa's llvmpipe renders with
no GPU). Qt is imported only when the GUI's application draws: the CLI renders without one.
"""
from __future__ import annotations

import os

import numpy as np

from engine.io.atomic import OutputError

BACKGROUND = (0.08, 0.08, 0.1, 1.0)
TRAJECTORY_RGBA = (1.0, 0.47, 0.16, 1.0)


_EGL_APP = None


def _scene():
    """vispy's scene module and the application whose GL context draws: the running one (the
    GUI's), else an EGL application of our own. The EGL one is passed to each canvas and never made
    vispy's default, so a Qt window created later in the process still gets the Qt backend."""
    global _EGL_APP
    from vispy import app as vapp
    from vispy import scene
    from vispy.app import _default_app

    if _default_app.default_app is not None:
        return scene, _default_app.default_app
    if _EGL_APP is None:
        if not os.environ.get("DISPLAY"):
            # Mesa's EGL needs a platform without X; a setting of the library, not ours
            os.environ.setdefault("EGL_PLATFORM", "surfaceless")
        try:
            _EGL_APP = vapp.Application("egl")
        except Exception as exc:       # no libEGL, no driver: say so (the other exports go on)
            why = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise OutputError(f"the video export renders offscreen with vispy through EGL, which is not "
                              f"available here ({why}); install Mesa's libEGL (apt install libegl1 "
                              "libgl1-mesa-dri)") from None
    return scene, _EGL_APP


class OffscreenRenderer:
    """`OffscreenRenderer(points, colors, centres, (W, H))`; `render(clip)` -> H x W x 3 uint8 RGB
    seen through the clip matrix (engine.io.video.clip_matrix); `close()`."""

    def __init__(self, points, colors, centres, size, point_size=None):
        scene, app = _scene()
        from vispy.visuals.transforms import ChainTransform, MatrixTransform, STTransform

        class PoseCamera(scene.cameras.BaseCamera):
            """Scene transform = the viewbox mapping after one clip matrix (no interaction)."""

            def __init__(self):
                super().__init__(interactive=False)
                self.viewbox_tr = STTransform()
                self.clip = MatrixTransform()
                self.full = ChainTransform([self.viewbox_tr, self.clip])

            def _update_transform(self, event=None):
                if self._viewbox is None:
                    return
                self.viewbox_tr.set_mapping([[-1, 1], [1, -1]], [[0, 0], self._viewbox.size])
                self._set_scene_transform(self.full)

        self.W, self.H = (int(x) for x in size)
        self.canvas = scene.SceneCanvas(size=(self.W, self.H), show=False, bgcolor=BACKGROUND, keys=None,
                                        app=app)
        if "qt" in app.backend_name.lower() or "pyside" in app.backend_name.lower():
            # a Qt GL widget that was never shown has no initialised context and renders blank
            # frames: show it without putting it on screen
            from PySide6 import QtCore
            self.canvas.native.setAttribute(QtCore.Qt.WidgetAttribute.WA_DontShowOnScreen, True)
            self.canvas.show()
            app.process_events()
        view = self.canvas.central_widget.add_view()
        self.camera = PoseCamera()
        view.camera = self.camera
        pts = np.asarray(points, np.float32).reshape(-1, 3)
        if len(pts):
            cols = np.asarray(colors, np.uint8).reshape(-1, 3)
            rgba = np.concatenate([cols / 255.0, np.ones((len(cols), 1))], axis=1).astype(np.float32)
            markers = scene.visuals.Markers(parent=view.scene)
            markers.set_data(pts, face_color=rgba, edge_width=0,
                             size=point_size or max(1.5, 2.0 * self.H / 720))
            markers.set_gl_state("opaque", depth_test=True)
        centres = np.asarray(centres, np.float32).reshape(-1, 3)
        if len(centres) >= 2:
            line = scene.visuals.Line(pos=centres, color=TRAJECTORY_RGBA, parent=view.scene, width=2)
            line.set_gl_state("opaque", depth_test=True)

    def render(self, clip: np.ndarray) -> np.ndarray:
        self.camera.clip.matrix = np.asarray(clip, np.float64).T    # vispy maps row vectors
        self.camera.view_changed()
        return self.canvas.render(size=(self.W, self.H))[..., :3]

    def close(self) -> None:
        self.canvas.close()
