"""The MP4 video export (engine/io/video.py drawn by ui/video_render.py's vispy offscreen
renderer): frame count and size as asked, frames that show the cloud, the camera path lined up
with the session's own image, and the CLI's --video flags."""
import numpy as np

from engine.io.export import export_results
from tests.engine.factories import random_results
from ui.video_render import OffscreenRenderer


def _results(n=5, h=48, w=64, seed=0):
    return random_results(n=n, h=h, w=w, seed=seed)


def test_video_of_the_camera_path_and_an_orbit(tmp_path):
    import cv2

    from engine.io.video import ORBIT_SECONDS

    rs = _results(n=6)
    out = export_results(rs, {"video": tmp_path / "path.mp4"}, stride=1, video_size=(96, 64), video_fps=12,
                         video_renderer=OffscreenRenderer)
    cap = cv2.VideoCapture(str(tmp_path / "path.mp4"))
    frames = []
    while True:
        ok, f = cap.read()
        if not ok:
            break
        frames.append(f)
    assert out["video"]["frames"] == len(frames) == len(rs)
    assert frames[0].shape == (64, 96, 3)
    assert all(f.std() > 10 for f in frames)             # the cloud is drawn, not a blank frame
    assert not any(p.name.endswith(".mp4") and p.name.startswith(".") for p in tmp_path.iterdir())
    export_results(rs, {"video": tmp_path / "orbit.mp4"}, stride=2, video_size=(80, 64), video_fps=4,
                   video_orbit=True, video_renderer=OffscreenRenderer)
    cap = cv2.VideoCapture(str(tmp_path / "orbit.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == round(ORBIT_SECONDS * 4)
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (80, 64)
    ok, f = cap.read()
    assert ok and f.std() > 10


def test_video_camera_path_lines_up_with_the_session_image(tmp_path):
    """Rendered from a frame's own pose and intrinsics, the cloud of that frame alone lands where
    its pixels were: the frame's image and the video frame agree."""
    import cv2

    r = _results(n=1, h=48, w=64)[0]
    r.conf = None
    r.image = np.zeros_like(r.image)
    r.image[:, :32] = (255, 0, 0)                        # left half red, right half blue
    r.image[:, 32:] = (0, 0, 255)
    export_results([r], {"video": tmp_path / "v.mp4"}, stride=1, video_size=(64, 48), video_fps=5,
                   video_renderer=OffscreenRenderer)
    ok, f = cv2.VideoCapture(str(tmp_path / "v.mp4")).read()
    assert ok
    rgb = cv2.cvtColor(f, cv2.COLOR_BGR2RGB).astype(int)
    left, right = rgb[8:40, 4:26].reshape(-1, 3).mean(0), rgb[8:40, 38:60].reshape(-1, 3).mean(0)
    assert left[0] > 150 > left[2] and right[2] > 150 > right[0]


def test_cli_video_from_a_session(tmp_path):
    import cv2

    from app.cli import main
    from engine.api import SessionConfig
    from engine.io.store import SessionStore

    rs = _results()
    with SessionStore(tmp_path / "s", SessionConfig(), "synthetic") as store:
        for r in rs:
            store.write(r)
    assert main(["run", str(tmp_path / "s"), "--video", str(tmp_path / "a.mp4"), "--video-size", "64x48",
                 "--video-fps", "10", "--quiet"]) == 0
    cap = cv2.VideoCapture(str(tmp_path / "a.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == len(rs)
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (64, 48)
    assert cap.get(cv2.CAP_PROP_FPS) == 10
