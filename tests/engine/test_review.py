"""Review helpers: lazy session timeline (refresh while a run writes), frame selection, picking."""
import numpy as np
import pytest

from engine.api import EngineEvent, FrameResult, SessionConfig
from engine.io.store import SessionStore, StoreError
from engine.review import SessionTimeline, frames_up_to, pick_frustum, pick_nearest, place


def _r(i):
    return FrameResult(index=i, timestamp=i / 30, is_keyframe=i % 2 == 0, c2w=np.eye(4),
                       K=np.array([[50.0, 0, 15.5], [0, 50.0, 11.5], [0, 0, 1]]),
                       image=np.full((24, 32, 3), i, np.uint8), depth=np.full((24, 32), 1.0 + i, np.float32),
                       conf=np.ones((24, 32), np.float32))


def test_timeline_reads_a_growing_session_lazily(tmp_path):
    store = SessionStore(tmp_path / "s", SessionConfig(), "x")
    for i in range(3):
        store.write(_r(i))
    tl = SessionTimeline(tmp_path / "s", cache_frames=2)
    assert tl.indices == [0, 1, 2]
    store.write(_r(3))
    store.write_event(EngineEvent("realign", 0, np.eye(4)))
    assert tl.refresh() == [0, 1, 2, 3]                  # a live run adds frames
    store.write(_r(5))
    (tmp_path / "s" / "frames" / "notes.npz").write_bytes(b"")      # not a frame file: ignored
    assert tl.scan_in_background().result(timeout=30) == [0, 1, 2, 3, 5]
    assert tl.indices == [0, 1, 2, 3]                    # applied by the caller, on its thread
    r = tl.result(3)
    assert r.index == 3 and r.depth[0, 0] == pytest.approx(4.0) and r.depth.dtype == np.float32
    assert tl.result(3) is r and tl.result(99) is None
    tl.result(0), tl.result(1)
    assert len(tl._cache) == 2                           # bounded cache
    assert [e.kind for e in tl.events()] == ["realign"]
    store.close()
    import shutil
    shutil.rmtree(tmp_path / "s" / "frames")
    assert tl.refresh() == []                            # a removed session lists no frames
    with pytest.raises(StoreError):
        SessionTimeline(tmp_path / "nothing")


def test_frames_up_to_modes():
    idx = [0, 2, 3, 7]
    assert frames_up_to(idx, 3) == ([0, 2, 3], [0, 2, 3])
    assert frames_up_to(idx, 5, "current") == ([0, 2, 3], [3])
    assert frames_up_to(idx, -1, "current") == ([], [])
    with pytest.raises(ValueError):
        frames_up_to(idx, 3, "some")


def test_pick_nearest_takes_the_front_most_within_the_radius():
    xy = np.array([[10, 10], [12, 10], [11, 11], [50, 50]], float)
    depth = np.array([5.0, 2.0, -1.0, 0.5])              # -1: behind the camera
    assert pick_nearest(xy, depth, (11, 10), radius=3) == 1
    assert pick_nearest(xy, depth, (30, 30), radius=3) is None
    assert pick_nearest(np.zeros((0, 2)), np.zeros(0), (0, 0)) is None


def test_pick_frustum_hits_the_drawn_rectangle_and_edges_front_most_first():
    # two cameras seen face on: rectangles [0,100]x[0,60] (depth 5) and [50,150]x[20,80] (depth 2)
    quads = np.array([[[0, 0], [100, 0], [100, 60], [0, 60]],
                      [[50, 20], [150, 20], [150, 80], [50, 80]]], np.float64)
    apex = np.array([[50, 30], [100, 50]], np.float64)
    depth = np.array([5.0, 2.0])
    assert pick_frustum(apex, quads, depth, (20, 10)) == 0            # inside the first only
    assert pick_frustum(apex, quads, depth, (75, 40)) == 1            # both: the front-most
    assert pick_frustum(apex, quads[:, ::-1], depth, (75, 40)) == 1   # either winding
    assert pick_frustum(apex, quads, depth, (155, 50), radius=6) == 1  # near an edge, outside
    assert pick_frustum(apex, quads, depth, (160, 50), radius=6) is None
    assert pick_frustum(apex, quads, depth, (300, 300)) is None
    assert pick_frustum(apex, quads, np.array([5.0, -1.0]), (120, 50)) is None   # behind the eye
    assert pick_frustum(apex[:0], quads[:0], depth[:0], (0, 0)) is None


def test_place_moves_each_camera_by_its_own_transform():
    local = np.arange(2 * 5 * 3, dtype=np.float64).reshape(2, 5, 3)
    T0, T1 = np.eye(4), np.eye(4)
    T0[:3, 3] = (1, 2, 3)
    T1[:3, :3] = [[0, -1, 0], [1, 0, 0], [0, 0, 1]]
    out = place(local, np.stack([T0, T1]))
    assert np.allclose(out[0], local[0] + (1, 2, 3))
    assert np.allclose(out[1], local[1] @ T1[:3, :3].T)
