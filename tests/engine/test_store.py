"""The crash-safe session store: layout, downsampling, reload, and a SIGKILL mid-run."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine.api import EngineEvent, FrameResult, SessionConfig
from engine.geometry import backproject
from engine.io.store import (SessionStore, StoreError, downsample_result, load_session,
                             new_session_folder)
from tests.conftest import REPO


def _result(i, h=480, w=640, segment=0, pose_enc=False):
    rng = np.random.default_rng(i)
    c2w = np.eye(4)
    c2w[:3, 3] = [0.1 * i, 0, 0]
    yy, xx = np.mgrid[0:h, 0:w]
    return FrameResult(
        index=i, timestamp=i / 30.0, is_keyframe=i % 3 == 0, c2w=c2w,
        K=np.array([[480.0, 0, 319.5], [0, 480.0, 239.5], [0, 0, 1]]),
        image=rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
        depth=(1.0 + 0.001 * xx + 0.002 * yy).astype(np.float32),
        conf=np.full((h, w), 2.0 + i, np.float32),
        pose_enc=np.arange(9, dtype=np.float32) if pose_enc else None, segment=segment)


def test_layout_and_reload(tmp_path):
    folder = tmp_path / "s"
    cfg = SessionConfig(engine="geometric", window=32, intrinsics=(480.0, 480.0, 319.5, 239.5, 640, 480))
    store = SessionStore(folder, cfg, "video.mp4", meta={"kind": "video", "fps": 30.0})
    for i in range(3):
        store.write(_result(i, pose_enc=(i == 1), segment=i // 2))
    store.write_event(EngineEvent("realign", 1, np.diag([2.0, 2, 2, 1])))
    store.write_event(EngineEvent("warning", message="tracking lost"))
    info = json.loads((folder / "config.json").read_text())
    assert info["finished"] is None                       # still running
    store.close()

    assert sorted(p.name for p in (folder / "frames").iterdir()) == ["000000.npz", "000001.npz", "000002.npz"]
    assert len((folder / "events.jsonl").read_text().splitlines()) == 2
    s = load_session(folder)
    assert s.complete and s.problems == [] and s.source == "video.mp4"
    assert s.config == cfg and s.info["meta"] == {"kind": "video", "fps": 30.0}
    assert s.info["frames"] == 3 and s.info["started"]
    assert [r.index for r in s.results] == [0, 1, 2]
    r = s.results[1]
    # full result resolution (exports have the density the viewer drew), float16 on disk
    assert r.image.shape == (480, 640, 3) and r.depth.shape == (480, 640) and r.conf.shape == (480, 640)
    assert r.depth.dtype == np.float32 and r.image.dtype == np.uint8
    np.testing.assert_allclose(r.depth, _result(1).depth, rtol=1e-3)
    np.testing.assert_array_equal(r.conf, _result(1).conf)
    assert abs(r.image.mean() - _result(1).image.mean()) < 3      # JPEG (lossy: random noise is its worst case)
    assert s.info["max_side"] == 0 and s.info["image_codec"] == "jpeg" and s.info["depth_dtype"] == "float16"
    assert r.timestamp == pytest.approx(1 / 30) and r.is_keyframe is False and r.segment == 0
    np.testing.assert_array_equal(r.pose_enc, np.arange(9))
    assert s.results[0].pose_enc is None and s.results[2].segment == 1
    np.testing.assert_allclose(r.c2w[:3, 3], [0.1, 0, 0])
    assert [e.kind for e in s.events] == ["realign", "warning"]
    np.testing.assert_array_equal(s.events[0].transform, np.diag([2.0, 2, 2, 1]))
    assert s.events[1].message == "tracking lost"


def test_downsampled_depth_keeps_geometry():
    # K is rescaled with the image: the stored, small depth back-projects onto the same surface.
    r = _result(0)
    small = downsample_result(r, 256)
    np.testing.assert_allclose(small.K, [[192.0, 0, 127.5], [0, 192.0, 95.5], [0, 0, 1]])
    p_small, m = backproject(small.depth, small.K, small.c2w)
    vs, us = np.nonzero(m)
    # the same points from the full-resolution depth at the matching pixel centres
    fv = np.round((vs + 0.5) * 2.5 - 0.5).astype(int)
    fu = np.round((us + 0.5) * 2.5 - 0.5).astype(int)
    full, _ = backproject(r.depth, r.K, r.c2w)
    p_full = full.reshape(480, 640, 3)[fv, fu]
    np.testing.assert_allclose(p_small, p_full, atol=0.01)


def test_small_frames_are_not_upscaled(tmp_path):
    store = SessionStore(tmp_path / "s", SessionConfig(), "cam")
    store.write(_result(4, h=100, w=120))
    store.close()
    r = load_session(tmp_path / "s").results[0]
    assert r.depth.shape == (100, 120)
    np.testing.assert_allclose(r.K, _result(4).K)


def test_new_session_folder_and_refusal_to_overwrite(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONSTUDIO_SESSIONS", str(tmp_path / "root"))
    a = new_session_folder("/some/where/my clip.mp4")
    assert a.parent == tmp_path / "root" and a.name.endswith("_my_clip") and not a.exists()
    store = SessionStore(a, SessionConfig(), "x")
    store.write(_result(0, h=10, w=10))
    store.close()
    b = new_session_folder("/some/where/my clip.mp4")
    assert b != a
    with pytest.raises(StoreError, match="already holds a session"):
        SessionStore(a, SessionConfig(), "x")


def test_load_tolerates_crash_debris(tmp_path):
    folder = tmp_path / "s"
    store = SessionStore(folder, SessionConfig(), "clip")
    for i in range(3):
        store.write(_result(i, h=20, w=30))
    store.write_event(EngineEvent("info", message="ok"))
    # what a crash can leave: a temp file, a damaged last frame, a half-written event line
    (folder / "frames" / ".000003.npz.abc.tmp").write_bytes(b"PK\x03\x04partial")
    (folder / "frames" / "000002.npz").write_bytes(
        (folder / "frames" / "000002.npz").read_bytes()[:100])
    with open(folder / "events.jsonl", "a") as f:
        f.write('{"kind": "realign", "segm')
    s = load_session(folder)
    assert [r.index for r in s.results] == [0, 1]
    assert len(s.events) == 1 and s.events[0].message == "ok"
    assert not s.complete
    assert any("000002.npz" in p for p in s.problems) and any("event line 2" in p for p in s.problems)


def test_load_errors(tmp_path):
    with pytest.raises(StoreError, match="not found"):
        load_session(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(StoreError, match="not a ReconStudio session"):
        load_session(tmp_path / "plain")


CHILD = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, sys.argv[2])
    from engine.api import FrameResult, SessionConfig, EngineEvent
    from engine.io.store import SessionStore
    store = SessionStore(sys.argv[1], SessionConfig(), "endless")
    rng = np.random.default_rng(0)
    i = 0
    while True:   # runs until killed
        img = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
        store.write(FrameResult(i, i / 30, True, np.eye(4), np.eye(3), img,
                                rng.uniform(1, 2, (240, 320)).astype(np.float32), None))
        store.write_event(EngineEvent("info", message=str(i)))
        print(i, flush=True)
        i += 1
""")


def test_sigkill_mid_run_loses_nothing_committed(tmp_path):
    folder = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(REPO)],
                            stdout=subprocess.PIPE, text=True)
    try:
        committed = -1
        for line in proc.stdout:
            committed = int(line)
            if committed >= 12:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert committed >= 12 and proc.returncode == -signal.SIGKILL
    s = load_session(folder)
    got = [r.index for r in s.results]
    # every frame reported as written is there and intact; at most the next one besides
    assert got[: committed + 1] == list(range(committed + 1)) and len(got) <= committed + 3
    assert all(r.depth.shape == (240, 320) for r in s.results)
    assert [int(e.message) for e in s.events][: committed + 1] == list(range(committed + 1))
    assert not s.complete
    assert all(not p.startswith("skipped damaged frame") for p in s.problems)


@pytest.mark.parametrize("writers", [1, 3])
def test_background_writer_stores_everything_and_owns_its_copies(tmp_path, writers):
    store = SessionStore(tmp_path / "bg", SessionConfig(), "clip", background=True, queue_size=1,
                         writers=writers)
    assert store.writers == writers
    buf = _result(0, h=40, w=60)              # small frames: not downsampled, so copies matter
    expected = []
    for i in range(12):
        buf.index = i
        buf.depth[...] = 1.0 + i               # the "engine" reuses its buffers
        store.write(buf)
        expected.append(1.0 + i)
    store.close()
    assert store.frames_written == 12
    s = load_session(tmp_path / "bg")
    assert s.complete and s.info["frames"] == 12
    assert [float(r.depth[0, 0]) for r in s.results] == expected


def test_several_writers_keep_a_re_emitted_index_last(tmp_path):
    """A result re-emitted for an index (a keyframe's refined pose, a loop closure) must end up on
    disk over the one it replaces, however the writers interleave: one index, one writer."""
    store = SessionStore(tmp_path / "bg", SessionConfig(), "clip", background=True, queue_size=8, writers=3)
    for rnd in range(4):                       # every index written four times, latest = rnd 3
        for i in range(9):
            r = _result(i, h=48, w=64)
            r.depth[...] = 10.0 * rnd + i
            store.write(r)
    store.close()
    s = load_session(tmp_path / "bg")
    assert s.info["frames"] == 9 and store.frames_written == 36
    assert [float(r.depth[0, 0]) for r in s.results] == [30.0 + i for i in range(9)]


def test_writer_count_default_and_env_knob(monkeypatch):
    from engine.io.store import store_writers_default
    monkeypatch.delenv("RECONSTUDIO_STORE_WRITERS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert store_writers_default() == 1        # a 2-core machine: one writer, as before
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert store_writers_default() == 3
    monkeypatch.setenv("RECONSTUDIO_STORE_WRITERS", "2")
    assert store_writers_default() == 2
    monkeypatch.setenv("RECONSTUDIO_STORE_WRITERS", "0")
    with pytest.raises(StoreError, match="RECONSTUDIO_STORE_WRITERS"):
        store_writers_default()


@pytest.mark.parametrize("writers", [1, 3])
def test_background_writer_error_surfaces(tmp_path, writers):
    store = SessionStore(tmp_path / "bg", SessionConfig(), "clip", background=True, writers=writers)
    import shutil
    shutil.rmtree(tmp_path / "bg" / "frames")
    (tmp_path / "bg" / "frames").write_text("now a file")   # every frame write fails
    store.write(_result(0, h=10, w=10))
    with pytest.raises(StoreError, match="Cannot write"):
        for i in range(1, 5):
            store.write(_result(i, h=10, w=10))
        store.close()


def test_store_encodings_and_older_layouts_read_back(tmp_path):
    """raw images / float32 depth (the version-1 layout) and a downsampled store still load;
    float16 saturates instead of overflowing, NaN stays invalid."""
    r = _result(0)
    r.depth[0, :3] = [np.nan, 1e6, 0.0]
    r.conf[1, 0] = 1e9
    for kw, hw in ((dict(image_codec="raw", depth_dtype="float32", max_side=256), (192, 256)),
                   (dict(), (480, 640))):
        folder = tmp_path / str(len(kw))
        with SessionStore(folder, SessionConfig(), "x", **kw) as st:
            st.write(r)
        got = load_session(folder).results[0]
        assert got.depth.shape == hw and got.depth.dtype == np.float32 and got.image.shape[:2] == hw
        assert np.isfinite(got.conf).all()
        if not kw:                       # full resolution: the same pixels
            assert np.isnan(got.depth[0, 0]) and np.isfinite(got.depth[0, 1]) and got.depth[0, 1] > 6e4
        else:
            np.testing.assert_array_equal(got.image, downsample_result(r, 256).image)
    with pytest.raises(StoreError, match="encoding"):
        SessionStore(tmp_path / "bad", SessionConfig(), "x", image_codec="webp")


def test_several_writers_bound_the_frames_in_flight_and_end_their_threads(tmp_path, monkeypatch):
    """Over a long back-to-back run the writers hold at most writers x (queue_size + 1) frames (+1
    being queued): memory is bounded whatever the disk's speed; close() ends every writer thread
    and every frame is on disk."""
    import threading
    import weakref

    from engine.io import store as store_mod
    made = []
    real = store_mod.downsample_result

    def tracked(r, max_side):
        out = real(r, max_side)
        made.append(weakref.ref(out))
        return out
    monkeypatch.setattr(store_mod, "downsample_result", tracked)
    before = set(threading.enumerate())
    writers, qsize = 3, 2
    store = SessionStore(tmp_path / "bg", SessionConfig(), "clip", background=True, queue_size=qsize, writers=writers)
    mine = [t for t in threading.enumerate() if t not in before and t.name.startswith("session-store-writer")]
    assert len(mine) == writers
    peak = 0
    for i in range(240):
        store.write(_result(i, h=96, w=128))
        peak = max(peak, sum(ref() is not None for ref in made))
    store.close()
    assert peak <= writers * (qsize + 1) + 1, peak
    assert not [t for t in mine if t.is_alive()]
    s = load_session(tmp_path / "bg")
    assert s.complete and s.info["frames"] == 240 and [r.index for r in s.results] == list(range(240))
