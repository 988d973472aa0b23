"""engine.scene.SceneModel: the point budget holds, thinning keeps old geometry recognisable
(coverage per segment, keyframes denser, recent frames dense), appends cost O(new points) and
thinning is amortised, segment transforms re-place stored points."""
from types import SimpleNamespace

import numpy as np
import pytest

from engine.scene import MIN_POINT_BUDGET, RECENT_CAMERAS, SceneModel, chase_view
from tests.engine.geometric_drift import inject_scale_drift

BUDGET = MIN_POINT_BUDGET          # 100k: small enough for fast tests


def _frame(i, n=5000, segment=0, kf=True, x0=0.0, seed=None, conf=None):
    """n points on a 1 x 1 patch of the plane z = 2, starting at x = x0."""
    rng = np.random.default_rng(i if seed is None else seed)
    u = rng.random((n, 2))
    pts = np.stack([x0 + u[:, 0], u[:, 1], np.full(n, 2.0)], 1).astype(np.float32)
    return SimpleNamespace(
        index=i, segment=segment, is_keyframe=kf, points=pts,
        colors=rng.integers(0, 255, (n, 3), dtype=np.uint8),
        conf=(rng.random(n).astype(np.float32) if conf is None else np.full(n, conf, np.float32)),
        depth=np.full(n, 2.0, np.float32), c2w=np.eye(4),
        frustum=np.zeros((5, 3), np.float32))


def _cells(points, size=0.1):
    return {tuple(c) for c in np.floor(points[:, :2] / size).astype(int)}


def test_budget_is_never_exceeded_and_the_newest_frame_is_whole():
    m = SceneModel(BUDGET)
    for i in range(120):                     # 600k points offered over a sweep of 12 m
        m.add_frame(_frame(i, x0=0.1 * i))
        assert m.count <= BUDGET and m.capacity <= BUDGET
        assert (m.frame[: m.count] == i).sum() == 5000      # recent frames stay dense
    assert m.thinning_passes >= 2 and m.points_added == 120 * 5000


def test_thinning_keeps_coverage_of_old_segments():
    m = SceneModel(BUDGET)
    for i in range(40):                      # segment 0: x in [0, 5)
        m.add_frame(_frame(i, segment=0, x0=0.1 * i))
    before = _cells(m.positions[: m.count][m.segment[: m.count] == 0])
    for i in range(40, 200):                 # segment 1 elsewhere, 800k points
        m.add_frame(_frame(i, segment=1, x0=10 + 0.05 * i))
    assert m.thinning_passes >= 3
    seg0 = m.positions[: m.count][m.segment[: m.count] == 0]
    assert 0 < len(seg0) < 40 * 5000
    after = _cells(seg0)
    assert len(after & before) >= 0.95 * len(before)   # the old segment is still all there


def test_keyframes_are_kept_denser():
    m = SceneModel(BUDGET)
    for i in range(100):                     # the same patch again and again
        m.add_frame(_frame(i, kf=i % 2 == 0))
    assert m.thinning_passes >= 1
    old = m.frame[: m.thinned]
    kf = m.keyframe[: m.thinned]
    assert kf.sum() > 2 * (~kf).sum()        # a grid twice as fine keeps ~4x the points
    assert len(np.unique(old)) > 1


def test_append_is_o_new_and_thinning_is_amortised():
    m = SceneModel(BUDGET)
    m.add_frame(_frame(0))
    m.take_changes()
    m.add_frame(_frame(1))
    ch = m.take_changes()
    assert (ch.points_from, m.count) == (5000, 10000)   # only the new rows to upload
    rewrites = []
    for i in range(2, 400):
        keep = m.positions[: m.thinned].copy()
        passes = m.thinning_passes
        m.add_frame(_frame(i, x0=0.02 * i))
        ch = m.take_changes()
        if m.thinning_passes == passes:
            assert ch.points_from == m.count - 5000
        else:
            # rows before the first rewritten row are untouched (the view keeps them on the GPU)
            assert np.array_equal(m.positions[: ch.points_from], keep[: ch.points_from])
            rewrites.append(m.count - ch.points_from)
    assert len(rewrites) >= 5
    # total thinning work stays a small multiple of what was appended (not O(total) per frame)
    assert m.rows_rewritten <= 4 * m.points_added


def test_voxel_keeps_its_best_confidence():
    m = SceneModel(BUDGET)
    m.add_frame(_frame(0, seed=1, conf=9.0))          # the same points, high confidence
    for i in range(1, 40):
        m.add_frame(_frame(i, seed=1, conf=1.0))      # ... then low confidence
    assert m.thinning_passes >= 1
    assert np.all(m.conf[: m.thinned] == 9.0)
    assert m.count < 40 * 5000


def test_segment_transforms_replace_and_survive_thinning():
    m = SceneModel(BUDGET)
    for i in range(30):
        m.add_frame(_frame(i, segment=i % 2, x0=0.1 * i))
    T = np.eye(4)
    T[:3, :3] *= 2.0
    T[1, 3] = 5.0
    m.set_segment_transform(1, T)
    m.set_segment_transform(1, T)                     # absolute: the same, not twice
    stored = m.positions[: m.count].copy()
    w = m.world_positions()
    s1 = m.segment[: m.count] == 1
    assert np.allclose(w[~s1], stored[~s1])
    assert np.allclose(w[s1], stored[s1] * 2 + [0, 5, 0], atol=1e-5)
    for i in range(30, 60):
        m.add_frame(_frame(i, segment=1, x0=0.1 * i))
    s1 = m.segment[: m.count] == 1
    assert np.allclose(m.world_positions()[s1], m.positions[: m.count][s1] * 2 + [0, 5, 0], atol=1e-5)


def test_lower_budget_applies_at_the_next_frame():
    m = SceneModel(400_000)
    for i in range(60):
        m.add_frame(_frame(i, x0=0.1 * i))
    assert m.count == 300_000
    m.set_point_budget(BUDGET)
    m.add_frame(_frame(60, x0=6.0))
    assert m.count <= BUDGET


def test_cameras_are_bounded_newest_kept():
    m = SceneModel(BUDGET, camera_budget=2 * RECENT_CAMERAS)
    for i in range(2000):
        f = _frame(i, n=0, kf=i % 10 == 0)
        f.c2w = np.eye(4)
        f.c2w[0, 3] = i
        m.add_frame(f)
        assert m.camera_count <= 2 * RECENT_CAMERAS
    idx = m.cam_index[: m.camera_count]
    assert np.all(np.diff(idx) > 0)
    assert np.array_equal(idx[-RECENT_CAMERAS + 1:], np.arange(2000 - RECENT_CAMERAS + 1, 2000))
    assert idx[0] == 0                                # the start of the path is still there
    old = m.cam_keyframe[: m.camera_count - RECENT_CAMERAS]
    assert old.mean() > 0.1                          # keyframes kept before other cameras


def test_clear_reuses_the_arrays():
    m = SceneModel(BUDGET)
    for i in range(30):
        m.add_frame(_frame(i))
    cap = m.capacity
    m.clear()
    assert m.count == 0 and m.capacity == cap and m.camera_count == 0
    ch = m.take_changes()
    assert not ch.capacity_changed and ch.points_from == 0


def test_background_passes_keep_the_budget_and_match_coverage():
    """With background=True the expensive part of a pass runs on a thread; the budget still
    holds at every frame and the result covers what a synchronous model covers."""
    bg, fg = SceneModel(BUDGET, background=True), SceneModel(BUDGET)
    for i in range(150):
        f = _frame(i, segment=i // 50, x0=0.05 * i)
        bg.add_frame(f)
        fg.add_frame(f)
        assert bg.count <= BUDGET
    bg.wait()
    assert bg.thinning_passes >= 3 and bg.count <= BUDGET
    for seg in range(3):
        a = _cells(bg.positions[: bg.count][bg.segment[: bg.count] == seg])
        b = _cells(fg.positions[: fg.count][fg.segment[: fg.count] == seg])
        assert len(a & b) >= 0.9 * len(b)
    bg.clear()                                  # a pass of the old run is dropped, not applied
    bg.add_frame(_frame(0))
    bg.wait()
    assert bg.count == 5000 and bg.thinned == 0


def test_framing_and_chase_view():
    m = SceneModel(BUDGET)
    assert m.framing() is None
    for i in range(10):
        f = _frame(i, x0=float(i))
        f.c2w = np.eye(4)
        f.c2w[0, 3] = i
        m.add_frame(f)
    centre, extent = m.framing()
    assert abs(centre[0] - 5.0) < 0.3 and 9 < extent < 13      # cloud x in [0, 10], path too
    T = np.eye(4)
    T[1, 3] = 100.0
    m.set_segment_transform(0, T)
    assert abs(m.framing()[0][1] - 100.5) < 1.5                 # framing follows the transform
    c2w = np.eye(4)                                             # looking along +z
    v = chase_view(c2w, [0, 0, 2], 2.0, T)
    assert abs(v["azimuth"] - 90.0) < 1e-6 and abs(v["elevation"] - 15.0) < 1e-6
    assert v["center"] == (0.0, 100.0, 2.0) and v["distance"] == 4.0


# -- frame-range re-alignment (loop closure events) --------------------------------------------

def _sim(s=1.0, t=(0, 0, 0), yaw=0.0):
    c, n = np.cos(yaw), np.sin(yaw)
    T = np.eye(4)
    T[:3, :3] = s * np.array([[c, 0, n], [0, 1, 0], [-n, 0, c]])
    T[:3, 3] = t
    return T


def _cam_frame(i, segment=0, n=2000):
    f = _frame(i, n=n, segment=segment, x0=0.1 * i)
    f.c2w = np.eye(4)
    f.c2w[0, 3] = 0.1 * i
    return f


def _expected_centres(m, events):
    """Camera centres as engine.geometry (the exports) places them."""
    from engine.api import FrameResult
    from engine.geometry import apply_realignments
    n = m.camera_count
    rs = []
    for s, i, c in zip(m.cam_segment[:n], m.cam_index[:n], m.cam_center[:n].astype(np.float64)):
        c2w = np.eye(4)
        c2w[:3, 3] = c
        rs.append(FrameResult(index=int(i), timestamp=0.0, is_keyframe=True, c2w=c2w, K=np.eye(3),
                              image=None, depth=None, conf=None, segment=int(s)))
    return np.array([r.c2w[:3, 3] for r in apply_realignments(rs, events)])


def test_frame_range_realign_moves_exactly_those_frames():
    from engine.api import EngineEvent
    m = SceneModel(BUDGET)
    for i in range(20):
        m.add_frame(_cam_frame(i, segment=0 if i < 15 else 1))
    stored_p = m.positions[: m.count].astype(np.float64)
    stored_c = m.cam_center[: m.camera_count].astype(np.float64)
    m.take_changes()
    T = _sim(1.5, (0, 2, 0), 0.3)
    ev = [EngineEvent("realign", 0, T, frames=(5, 9))]
    m.apply_events(ev)
    ch = m.take_changes()
    assert ch.transforms_from == 5 and ch.frames == 20          # only frames 5.. are re-read
    w = m.world_positions()
    inside = (m.frame[: m.count] >= 5) & (m.frame[: m.count] <= 9)
    assert np.allclose(w[~inside], stored_p[~inside])
    assert np.allclose(w[inside], stored_p[inside] @ T[:3, :3].T + T[:3, 3], atol=1e-5)
    c = m.camera_centers()
    assert np.allclose(c[:5], stored_c[:5]) and np.allclose(c[10:], stored_c[10:])
    assert np.allclose(c[5:10], stored_c[5:10] @ T[:3, :3].T + T[:3, 3])
    assert np.allclose(c, _expected_centres(m, ev))
    assert np.allclose(m.frame_matrices(5, 10), T) and np.allclose(m.frame_transform(4), np.eye(4))


def test_later_events_replace_earlier_ones_on_their_frames_only():
    from engine.api import EngineEvent
    m = SceneModel(BUDGET)
    for i in range(12):
        m.add_frame(_cam_frame(i))
    A, B, C, D = _sim(2.0, (1, 0, 0)), _sim(1.0, (0, 3, 0), 0.5), _sim(0.5, (0, 0, 7)), _sim(1.2, (4, 4, 4))
    ev = [EngineEvent("realign", 0, A),                          # whole segment
          EngineEvent("realign", 0, B, frames=(2, 6)),
          EngineEvent("realign", 0, C, frames=(5, 20)),          # later: replaces B on 5, 6
          EngineEvent("realign", 1, D)]                          # another segment: no effect
    m.apply_events(ev[:2])
    m.take_changes()                                             # resolved in two batches
    m.apply_events(ev[2:])
    assert np.allclose(m.camera_centers(), _expected_centres(m, ev))
    mats = m.frame_matrices()
    assert np.allclose(mats[:2], A) and np.allclose(mats[2:5], B) and np.allclose(mats[5:], C)
    for i in range(12, 16):                                      # later frames the range covers
        m.add_frame(_cam_frame(i))
    assert np.allclose(m.frame_matrices(12, 16), C)
    assert np.allclose(m.camera_centers(), _expected_centres(m, ev))
    m.apply_events([EngineEvent("realign", 0, A)])               # a whole-segment event replaces all
    assert np.allclose(m.frame_matrices(), A)


def test_frame_range_transforms_survive_thinning_within_budget():
    from engine.api import EngineEvent
    m = SceneModel(BUDGET)
    T = _sim(1.0, (0, 50, 0))
    m.apply_events([EngineEvent("realign", 0, T, frames=(0, 9))])
    for i in range(80):                          # 400k points offered: thinned to the budget
        m.add_frame(_frame(i, x0=0.1 * i))
        assert m.count <= BUDGET
    assert m.thinning_passes >= 1
    old = m.frame[: m.count] < 10
    assert old.any() and m.thinned > 0
    w = m.world_positions()
    assert np.all(w[old, 1] >= 50) and np.all(w[~old, 1] <= 1.0)   # thinned rows keep their frame
    assert np.allclose(w[old], m.positions[: m.count][old] + [0, 50, 0], atol=1e-5)


def test_real_loop_closure_events_place_cameras_as_the_export(monkeypatch):
    """The geometric engine's own loop-closure events (ICL forward then back with the artificial
    scale drift of test_geometric_loop), applied as they arrive, interleaved with the frames:
    the cameras end where engine.geometry.apply_realignments puts them for the exports."""
    import cv2

    from engine.api import SessionConfig, open_session
    from engine.evaluate import load_sequence
    from engine.geometry import apply_realignments
    from tests.conftest import DATA
    inject_scale_drift(monkeypatch)
    seq = load_sequence(DATA / "icl_livingroom_kt3")
    frames = [cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in seq.frames]
    s = open_session(SessionConfig(engine="geometric", intrinsics=seq.intrinsics.as_tuple(), extra={"depth": False}))
    m = SceneModel(BUDGET)
    res, ev = [], []

    def feed(rs, es):
        for r in rs:
            f = _frame(r.index, n=10, segment=r.segment)
            f.c2w = r.c2w
            m.add_frame(f)
        m.apply_events(es)
        res.extend(rs)
        ev.extend(es)
    for k, i in enumerate(list(range(200)) + list(range(199, -1, -1))):
        feed(s.push(frames[i], k / 30.0), s.poll_events())
        if k % 37 == 0:
            m.take_changes()                     # resolved in several batches, as the viewer draws
    feed(s.flush(), s.poll_events())
    s.close()
    ranged = [e for e in ev if e.kind == "realign" and e.frames is not None]
    assert len(ranged) >= 10
    want = {r.index: r.c2w[:3, 3] for r in apply_realignments(res, ev)}
    got = m.camera_centers()
    idx = m.cam_index[: m.camera_count]
    assert len(idx) == 400
    assert max(np.abs(m.cam_center[j] - want[int(i)]).max() for j, i in enumerate(idx)) > 0.005   # moved
    np.testing.assert_allclose(got, np.array([want[int(i)] for i in idx]), atol=1e-5)


def test_superseded_realign_events_are_dropped_and_placement_is_unchanged():
    """Loop closures re-send keyframe stretches (moving boundaries, some skipped, from a moving first frame,
    whole-segment events in between, two segments): the model keeps a bounded number of events,
    and after every closure every frame — held ones and frames added later — is placed exactly
    as by the full event list."""
    from engine.api import EngineEvent
    rng = np.random.default_rng(3)
    m = SceneModel(BUDGET)
    every: list = []
    n = applied = 0
    kept = []
    for closure in range(60):
        for _ in range(5):                      # frames arrive between closures
            m.add_frame(_cam_frame(n, segment=n % 2, n=20))
            n += 1
        for seg in (0, 1):
            if closure % 17 == 5:
                every.append(EngineEvent("realign", seg, _sim(1.0 + 0.01 * closure, (seg, closure, 0))))
            cuts = np.unique(np.r_[rng.integers(0, n // 2 + 1, 2), rng.integers(1, n, 5), n])
            for a, b in zip(cuts[:-1], cuts[1:]):   # earlier frames keep older events
                if rng.random() < 0.3:               # the engine re-sends only changed stretches
                    continue
                every.append(EngineEvent("realign", seg, _sim(1.0, (0.01 * closure, a, seg), 0.001 * b),
                                         frames=(int(a), int(b) - 1 if b < n else n + 3)))
        if closure % 10 == 3:                   # wide, then only partly covered by later ranges
            every.append(EngineEvent("realign", 0, _sim(0.9, (7, closure, 7)), frames=(2, 10**6)))
        m.apply_events(every[applied:])
        applied = len(every)
        m.take_changes()
        kept.append(len(m.events))
        assert np.allclose(m.camera_centers(), _expected_centres(m, every)), closure
    assert m.events_dropped > 0.5 * len(every)
    assert max(kept) < 0.25 * len(every)                     # bounded, not every event of the run
    for _ in range(10):                      # later frames: the last ranges cover n..n+3, then the wide one
        m.add_frame(_cam_frame(n, segment=n % 2, n=20))
        n += 1
    assert np.allclose(m.camera_centers(), _expected_centres(m, every))


def test_an_event_is_dropped_only_where_later_ranges_cover_all_its_frames():
    from engine.api import EngineEvent
    A, B, C = _sim(1.0, (1, 0, 0)), _sim(1.0, (0, 2, 0)), _sim(1.0, (0, 0, 3))
    for later, dropped in ((((0, 4), (6, 9)), False),        # frame 5: only the old event covers it
                           (((0, 4), (5, 9)), True),         # adjacent ranges cover 0..9
                           (((3, 9), (0, 3)), True)):
        m = SceneModel(BUDGET)
        for i in range(12):
            m.add_frame(_cam_frame(i))
        ev = [EngineEvent("realign", 0, A, frames=(0, 9))] + [
            EngineEvent("realign", 0, T, frames=r) for T, r in zip((B, C), later)]
        m.apply_events(ev)
        m.take_changes()
        m._compact_events()                     # (the model runs it once 64+ events are held)
        assert m.events_dropped == int(dropped) and len(m.events) == 3 - int(dropped)
        assert np.allclose(m.camera_centers(), _expected_centres(m, ev))


def test_thinning_pass_scratch_is_bounded_and_chunks_change_nothing(monkeypatch):
    """A pass hashes and gathers in chunks and sorts in place: the same plan whatever the chunk
    size, and its scratch is ~15 B per aged row (it was ~40 B: a 2 M-row pass of a soak run
    swung RSS by 40-70 MB while it ran), and moving rows copies one chunk at a time."""
    import tracemalloc

    import engine.scene as sc
    rng = np.random.default_rng(1)
    n = 400_000
    pos = (rng.random((n, 3)) * [6, 2.5, 6]).astype(np.float32)
    kf, seg = rng.random(n) < 0.2, (rng.random(n) < 0.3).astype(np.int32)
    conf = rng.random(n).astype(np.float32)
    vkeys = np.sort(rng.integers(0, 1 << 37, 5000).astype(np.uint64))
    whole = sc._plan(pos, kf, seg, conf, 7, n + 7, 0.5, vkeys, chunk=n)
    tracemalloc.start()
    try:
        chunked = sc._plan(pos, kf, seg, conf, 7, n + 7, 0.5, vkeys, chunk=50_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for k in ("rows", "best", "vkeys"):
        assert np.array_equal(getattr(whole, k), getattr(chunked, k))
    assert 0 < len(chunked.rows) < n // 20                     # a pass that keeps few rows (as in a soak)
    assert peak < 20 * n, peak / n                             # 12 B/row + chunk scratch; was ~40
    # the model's moves: chunked compaction gives the same arrays as one big copy
    monkeypatch.setattr(sc, "PASS_CHUNK", 1000)
    a, b = SceneModel(BUDGET), SceneModel(BUDGET)
    monkeypatch.setattr(sc, "PASS_CHUNK", 1 << 18)
    for i in range(60):
        b.add_frame(_frame(i, x0=0.03 * i))
    monkeypatch.setattr(sc, "PASS_CHUNK", 1000)
    for i in range(60):
        a.add_frame(_frame(i, x0=0.03 * i))
    assert a.thinning_passes == b.thinning_passes >= 2 and a.count == b.count
    for k in ("positions", "colors", "conf", "frame", "keyframe"):
        assert np.array_equal(getattr(a, k)[: a.count], getattr(b, k)[: b.count])
