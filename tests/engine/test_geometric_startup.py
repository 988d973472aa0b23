"""Geometric engine start-up: slow motions initialise (no fixed 60-frame limit), a clip that cannot
be initialised ends with a clear message (session and CLI), the typed settings reach the engine."""
import cv2
import numpy as np
import pytest

from app.cli import main
from engine.api import EngineError, SessionConfig, open_session
from tests.engine.accuracy import check
from tests.engine.geometric_drift import rgb_sequence


@pytest.fixture(scope="module")
def icl():
    return rgb_sequence("icl_livingroom_kt3", 90)


def _run(seq, frames, **kw):
    s = open_session(SessionConfig(engine="geometric", intrinsics=seq.intrinsics.as_tuple(), depth=False,
                                   loop_closure=False, **kw))
    res = []
    for i, f in enumerate(frames):
        res += s.push(f, i / 30.0)
    res += s.flush()
    ev = s.poll_events()
    st = s.stats()
    s.close()
    return res, ev, st


def test_slow_motion_initialises_and_poses_every_frame(icl):
    """The ICL start played 4× slower (every frame repeated 4 times): the tracker only starts after
    ~150 frames, beyond the old fixed 60-frame window; with the default start-up window every frame
    is posed, with a 60-frame window the oldest are given up and a warning says why."""
    seq, frames = icl
    slow = [f for f in frames for _ in range(4)]
    res, ev, st = _run(seq, slow)
    assert len(res) == len(slow) and st["untracked"] == 0
    res60, ev60, st60 = _run(seq, slow, init_max_frames=60)
    assert st60["untracked"] > 0 and len(res60) < len(slow)
    assert any(e.kind == "warning" and "init_max_frames" in e.message for e in ev60)


def test_a_clip_that_cannot_start_says_so(icl):
    seq, frames = icl
    res, ev, st = _run(seq, [frames[0]] * 40)
    assert res == [] and st["untracked"] == 40
    warn = [e.message for e in ev if e.kind == "warning"]
    assert any("No frame could be posed" in m and "40 frame(s)" in m and "init_max_frames" in m for m in warn)


def test_cli_reports_an_uninitialisable_clip(icl, tmp_path, capsys):
    seq, frames = icl
    folder = tmp_path / "static"
    folder.mkdir()
    for i in range(12):
        cv2.imwrite(str(folder / f"{i:06d}.jpg"), cv2.cvtColor(frames[0], cv2.COLOR_RGB2BGR))
    code = main(["run", str(folder), "--engine", "geometric", "--quiet", "--session-dir", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2
    assert "No frame could be posed" in err and "no results" in err


@pytest.mark.parametrize("kw", [{"init_max_frames": 1}, {"init_min_parallax_deg": 0.0}, {"max_depth_ratio": 0.5}])
def test_bad_startup_settings_are_reported(kw):
    with pytest.raises(EngineError):
        open_session(SessionConfig(engine="geometric", **kw))


def test_far_depth_is_dropped():
    from engine.geometric.depth import limit_depth
    depth = np.full((20, 30), 2.0, np.float32)
    depth[:2] = 60.0                       # a streak 30x the scene depth
    depth[5, 5] = 0.0
    conf = np.ones_like(depth)
    d, c, frac = limit_depth(depth, conf, np.full(50, 2.0), max_ratio=8.0)
    assert (d[:2] == 0).all() and (c[:2] == 0).all() and (d[2:][depth[2:] > 0] == 2.0).all()
    assert abs(frac - 60 / 599) < 1e-6
    d2, _, frac2 = limit_depth(depth, conf, np.full(3, 2.0), max_ratio=8.0)   # too few map points: untouched
    assert frac2 == 0 and (d2 == depth).all()


def test_huge_input_runs_at_a_working_size_with_a_message(icl):
    """3840×2160 frames (the ICL view cropped to 16:9 and upscaled): processed at 640×360, said
    in an info event, keyframes still get depth."""
    seq, frames = icl
    s = open_session(SessionConfig(engine="geometric", loop_closure=False))
    res = []
    for i, f in enumerate(frames[30:90]):
        res += s.push(cv2.resize(f[30:390], (3840, 2160), interpolation=cv2.INTER_LINEAR), i / 30.0)
    res += s.flush()
    ev = s.poll_events()
    s.close()
    assert len(res) == 60 and all(r.image.shape == (360, 640, 3) for r in res)
    assert any("3840×2160" in e.message and "640×360" in e.message for e in ev)
    check(("best keyframe depth density", max((r.depth > 0).mean() for r in res if r.is_keyframe and r.depth is not None), ">", 0.02))
