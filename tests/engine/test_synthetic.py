"""The synthetic soak engine through the session contract: sizes, determinism, pacing, no torch."""
import subprocess
import sys
import time

import numpy as np
import pytest

from engine.api import EngineError, SessionConfig, available_engines, engine_capabilities, open_session


def _run(n, **kw):
    s = open_session(SessionConfig(engine="synthetic", **kw))
    frame = (np.arange(480 * 640 * 3) % 251).astype(np.uint8).reshape(480, 640, 3)
    out = [r for i in range(n) for r in s.push(frame, i / 30.0)] + s.flush()
    return s, out


def test_registered_and_dense_518x392():
    assert "synthetic" in available_engines()
    caps = engine_capabilities("synthetic")
    assert caps["needs_checkpoint"] is False and "synthetic_fps" in caps["fields"]
    s, out = _run(5)
    assert [r.index for r in out] == list(range(5))
    r = out[0]
    assert r.depth.shape == (392, 518) and r.conf.shape == (392, 518) and r.image.shape == (392, 518, 3)
    assert r.depth.dtype == np.float32 and (r.depth > 0).all() and r.image.dtype == np.uint8
    assert r.K[0, 2] == pytest.approx(259.0) and r.K[1, 2] == pytest.approx(196.0)
    # the camera moves smoothly: small steps, non-zero, rotation orthonormal
    steps = [np.linalg.norm(b.c2w[:3, 3] - a.c2w[:3, 3]) for a, b in zip(out, out[1:])]
    assert all(0 < d < 0.05 for d in steps)
    R = out[3].c2w[:3, :3]
    assert np.allclose(R @ R.T, np.eye(3), atol=1e-9)
    assert s.stats()["frames"] == 5 and any(e.kind == "info" for e in s.poll_events())


def test_deterministic_and_colours_follow_input():
    _, a = _run(3)
    _, b = _run(3)
    for x, y in zip(a, b):
        assert np.array_equal(x.depth, y.depth) and np.array_equal(x.image, y.image)
        assert np.array_equal(x.c2w, y.c2w)
    assert not np.array_equal(a[0].depth, a[2].depth)          # the scene changes over time
    s = open_session(SessionConfig(engine="synthetic"))
    red = np.zeros((480, 640, 3), np.uint8)
    red[..., 0] = 200
    assert (s.push(red)[0].image[..., 0] == 200).all()


def test_tiny_input_gets_procedural_texture():
    s = open_session(SessionConfig(engine="synthetic"))
    r = s.push(np.zeros((4, 4, 3), np.uint8))[0]
    assert r.image.shape == (392, 518, 3) and r.image.std() > 10


def test_rate_knob_paces_the_engine():
    s = open_session(SessionConfig(engine="synthetic", synthetic_fps=50.0))
    t0 = time.perf_counter()
    for _ in range(11):
        s.push(None)
    assert time.perf_counter() - t0 >= 10 / 50.0 * 0.95
    assert s.stats()["fps"] == pytest.approx(50.0, rel=0.3)


def test_segments_and_bad_settings():
    s, out = _run(7, synthetic_segment_frames=3)
    assert [r.segment for r in out] == [0, 0, 0, 1, 1, 1, 2]
    kinds = [e.kind for e in s.poll_events()]
    assert kinds.count("segment") == 2 and kinds.count("realign") == 2
    with pytest.raises(EngineError):
        open_session(SessionConfig(engine="synthetic", synthetic_fps=-1))
    with pytest.raises(EngineError):
        open_session(SessionConfig(engine="synthetic", image_width=500))


def test_imports_no_torch():
    code = ("import sys, engine.api as a; s = a.open_session(a.SessionConfig(engine='synthetic')); "
            "s.push(None); assert 'torch' not in sys.modules and 'cv2' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
