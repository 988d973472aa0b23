"""The viewer's level of detail: with an (injected) cost per point that says the full cloud
misses the frame-time target it draws a draw-order prefix plus the newest frames in full, and
everything once the view has stood still; the per-level index lists follow thinning."""
import numpy as np
import pytest
from PySide6 import QtGui

from engine.scene import LOD_LEVELS
from ui import cloud_visual
from ui import viewer as viewer_module
from ui.viewer import LIVE_FRAMES, REFINE_CHUNK_TARGETS, PointCloudViewer
from tests.ui.test_ui_viewer import _frame, _lit


@pytest.fixture(params=["blocks of the default size", "blocks of 256 entries"])
def viewer(qtbot, request, monkeypatch):
    if request.param.endswith("256 entries"):    # each level's list spans many GPU index blocks
        monkeypatch.setattr(cloud_visual, "INDEX_BLOCK", 256)
    v = PointCloudViewer(capacity=1 << 14)
    qtbot.addWidget(v)
    v.resize(480, 360)
    v.show()
    qtbot.waitExposed(v)
    v.measure_cost = False
    return v


def _fill(v, frames=12):
    v.add_frames([_frame(i, x=0.03 * i) for i in range(frames)])
    for _ in range(20):                          # buffers grown: uploaded a piece per draw
        v.render_image()
        if not v.catching_up:
            break


def test_reduced_draw_is_a_prefix_plus_the_newest_frames(viewer, qtbot):
    _fill(viewer)
    full = viewer.render_image()              # cost unknown, scene under PROBE_POINTS: all
    assert viewer.drawn_points == viewer.point_count and viewer.cloud.draw_plan is None
    m = viewer.scene
    viewer.cost_per_point_ms = viewer.frame_time_target_ms / (0.3 * m.count)   # 30 % fits
    with qtbot.waitSignal(viewer.detail_changed) as sig:
        reduced = viewer.render_image()
    assert sig.args[0] < 1.0 and viewer.detail_reduced and viewer.detail_text
    assert viewer.drawn_points <= 0.3 * m.count
    views, (first, n) = viewer.cloud.draw_plan
    # the newest frames in full, whatever the detail: LIVE_FRAMES of them while they take at
    # most half the points that fit, else the newest alone
    two = m.first_row_of_frame(m.frames_added - LIVE_FRAMES)
    k = LIVE_FRAMES if m.count - two <= 0.3 * m.count / 2 else 1
    assert first == m.first_row_of_frame(m.frames_added - k) and first + n == m.count
    assert set(np.unique(m.frame[first:m.count])) == set(range(m.frames_added - k, m.frames_added))
    # before them: whole levels 0..j of the draw order, from the per-level index lists
    j = viewer.plan_level
    assert sum(cnt for _, cnt in views) == sum(viewer.levels.count_before(k, first) for k in range(j + 1))
    rows = np.sort(np.concatenate([viewer.levels.host[k][:viewer.levels.count_before(k, first)]
                                   for k in range(j + 1)]))
    assert np.array_equal(rows, m.draw_prefix(j, first))
    assert viewer.drawn_points == len(rows) + n
    # it is drawn (indexed draws reach the screen) and covers about the same area, not a corner
    lit_full, lit_red = _lit(full).sum(), _lit(reduced).sum()
    assert 0.5 * lit_full < lit_red <= lit_full


def test_still_view_is_refined_to_full_detail(viewer, qtbot):
    _fill(viewer)
    viewer.render_image()
    viewer.cost_per_point_ms = viewer.frame_time_target_ms / (0.3 * viewer.point_count)
    texts = set()                                # what the status bar is told
    viewer.detail_changed.connect(lambda _f: texts.add(viewer.detail_text))
    viewer.view.camera.azimuth += 1.0            # a new picture: reduced until the view is still
    qtbot.waitUntil(lambda: viewer.detail_reduced, timeout=10_000)
    # nothing moves: the idle refinement adds what was left out, a bounded chunk per draw
    chunks0 = viewer.refine_chunks
    qtbot.waitUntil(lambda: viewer.drawn_points == viewer.point_count, timeout=20_000)
    assert not viewer.detail_reduced and not viewer.refining
    budget = REFINE_CHUNK_TARGETS * viewer.frame_time_target_ms / viewer.cost_per_point_ms
    assert viewer.refine_chunks - chunks0 >= 2           # 70 % left out, 60 % a chunk
    assert 0 < viewer.max_chunk_points <= budget
    # the status bar's words: reduced while moving, then refining, then nothing (full detail)
    assert any(t.endswith("while moving") for t in texts) and any(t.endswith(", refining") for t in texts)
    assert viewer.detail_text == ""
    # the camera moves: reduced again
    viewer.view.camera.azimuth += 30.0
    viewer.render_image()
    assert viewer.detail_reduced


def test_refinement_waits_a_few_of_the_recent_intervals_between_changes(viewer, monkeypatch):
    """Stillness is judged by the cadence the view was changing at: after changes 40 ms apart
    the wait is IDLE_CADENCES of them (not less than IDLE_MIN_MS); after changes a second apart,
    or a single change after a long stillness, it is IDLE_REFINE_MS."""
    clock = [100.0]
    monkeypatch.setattr(viewer_module.time, "perf_counter", lambda: clock[0])
    assert viewer._idle_wait_ms(True) == viewer_module.IDLE_REFINE_MS       # nothing moved before
    waits = []
    for _ in range(30):
        clock[0] += 0.040
        waits.append(viewer._idle_wait_ms(True))
    fast = max(viewer_module.IDLE_MIN_MS, viewer_module.IDLE_CADENCES * 40)
    assert abs(waits[-1] - fast) <= 2 and waits[-1] < viewer_module.IDLE_REFINE_MS
    assert waits == sorted(waits, reverse=True)                             # converges from above
    assert viewer._idle_wait_ms(False) == waits[-1]                         # a redraw is no change
    for _ in range(30):
        clock[0] += 1.0
        slow = viewer._idle_wait_ms(True)
    assert slow == viewer_module.IDLE_REFINE_MS


def test_cheap_points_draw_everything(viewer):
    _fill(viewer)
    viewer.cost_per_point_ms = 1e-9
    viewer.render_image()
    assert viewer.cloud.draw_plan is None and viewer.drawn_points == viewer.point_count


def test_level_index_follows_thinning(qtbot):
    v = _small_shown_viewer(qtbot, capacity=1 << 14, point_budget=100_000)
    m = v.scene
    for i in range(40):                          # 4800 points a frame: several thinning passes
        v.add_frames([_frame(i, x=0.05 * i)])
        v.sync()
    m.wait()
    v.add_frames([_frame(40, x=2.0)])
    v.sync()
    assert m.thinning_passes >= 2
    for k in range(LOD_LEVELS):
        assert np.array_equal(v.levels.host[k][: v.levels.used[k]],
                              np.flatnonzero(m.level[: m.count] == k))


def _small_shown_viewer(qtbot, capacity=1 << 17, point_budget=1_000_000):
    """A shown 320x240 viewer with room for `capacity` rows and a fixed (tiny) cost per point."""
    v = PointCloudViewer(capacity=capacity, point_budget=point_budget)
    qtbot.addWidget(v)
    v.resize(320, 240)
    v.show()
    qtbot.waitExposed(v)
    v.measure_cost, v.cost_per_point_ms = False, 1e-9
    return v


def _screen(v):
    """What the widget shows now: its framebuffer, read back without drawing again."""
    from vispy.gloo import gl
    w = v.canvas.native
    w.makeCurrent()                              # binds the widget's framebuffer
    try:
        pw, ph = v.canvas.physical_size
        buf = gl.glReadPixels(0, 0, pw, ph, gl.GL_RGBA, gl.GL_UNSIGNED_BYTE)
    finally:
        w.doneCurrent()
    return np.frombuffer(buf, np.uint8).reshape(ph, pw, 4)[::-1].copy()


@pytest.mark.parametrize("show_ms", [0, 600_000])
def test_refinement_adds_up_to_the_full_picture(viewer, qtbot, monkeypatch, show_ms):
    """The chunks are drawn on top of the kept picture: once refined, the screen shows what one
    draw of every point shows (and more than the reduced draw did) -- whether each chunk is
    shown by a paint (show_ms 0) or drawn unseen and only the last one shown."""
    monkeypatch.setattr(viewer_module, "REFINE_SHOW_MS", show_ms)
    _fill(viewer, frames=20)
    viewer.set_point_size(1.0)
    viewer.render_image()
    viewer.cost_per_point_ms = viewer.frame_time_target_ms / (0.15 * viewer.point_count)
    monkeypatch.setattr(viewer_module, "IDLE_MIN_MS", 600_000)    # (the view "stands still" when
    monkeypatch.setattr(viewer_module, "IDLE_REFINE_MS", 600_000)  # the test says so)
    viewer.view.camera.azimuth += 1.0            # a new picture: reduced, refined after a wait
    qtbot.waitUntil(lambda: viewer.detail_reduced, timeout=10_000)
    reduced = _screen(viewer)
    assert not viewer.refining
    viewer._idle.setInterval(0)
    viewer._idle.start()
    unshown = viewer.unshown_chunks
    chunks = viewer.refine_chunks
    qtbot.waitUntil(lambda: viewer.drawn_points == viewer.point_count, timeout=20_000)
    qtbot.wait(50)
    refined = _screen(viewer)
    chunks = viewer.refine_chunks - chunks
    assert chunks >= 3                           # 85 % left out, 30 % a chunk
    assert viewer.unshown_chunks - unshown == (0 if show_ms == 0 else chunks - 1)
    viewer.full_render = True
    full = viewer.render_image()
    viewer.full_render = False
    lr, lf, lx = _lit(reduced), _lit(refined), _lit(full)
    print(lr.sum(), lf.sum(), lx.sum(), (lf & lx).sum() / (lf | lx).sum())
    assert lr.sum() < 0.9 * lf.sum()
    assert (lf & lx).sum() / (lf | lx).sum() > 0.95


def test_thinning_pass_is_uploaded_in_pieces(qtbot):
    """The rows a thinning pass rewrote go to the GPU a bounded piece per draw, the newest
    frames first; meanwhile the old layout's lists are drawn too (the picture does not lose
    what it showed) and the model holds back the next pass; afterwards the lists equal the
    model's."""
    v = _small_shown_viewer(qtbot, point_budget=100_000)   # draws everything: pictures comparable
    v.max_upload_rows = 7000
    spans = []
    upload = v._upload_rows
    v._upload_rows = lambda lo, hi: (spans.append((lo, hi, v._w)), upload(lo, hi))[1]
    m = v.scene
    i = 0
    while not v.catching_up and i < 80:
        before = v.render_image()
        v.add_frames([_frame(i, x=0.05 * i)])
        i += 1
        if m.thinning_passes:
            m.wait()                             # the pass is applied: rows rewritten
        v.render_image()
    assert v.catching_up and m.hold_passes
    draws = 1
    while v.catching_up:
        spans.clear()
        img = v.render_image()
        draws += 1
        assert _lit(img).sum() >= 0.9 * _lit(before).sum()   # old rows still drawn meanwhile
        # the catch-up's piece (the span from its pointer) is bounded
        assert all(hi - lo <= v.max_upload_rows for lo, hi, w in spans if lo == w)
        assert draws < 100
    assert draws >= 3 and v.catch_ups == 1 and not m.hold_passes
    for k in range(LOD_LEVELS):
        assert np.array_equal(v.levels.host[k][: v.levels.used[k]], np.flatnonzero(m.level[: m.count] == k))
    # the GPU now holds the model's rows: the same picture as after uploading them in one piece
    full = v.render_image()
    m._dirty_points, m._capacity_changed = 0, True
    v.max_upload_rows = None
    v._dirty = True
    ref = v.render_image()
    # (the same lit pixels; where points of several frames coincide exactly, a handful of
    # pixels may take a neighbouring point's colour)
    assert not v.catching_up and np.array_equal(_lit(ref), _lit(full))
    assert (np.abs(ref.astype(int) - full.astype(int)).sum(-1) > 0).mean() < 1e-3


def test_large_batch_is_uploaded_in_pieces_newest_first(qtbot):
    """Many frames at once (a slow GUI gets large batches): the newest frames are drawn at the
    first draw, the rest arrives a bounded piece per draw; appends stay O(new rows)."""
    v = _small_shown_viewer(qtbot)
    v.add_frames([_frame(0)])
    v.render_image()
    before = v.cloud.uploaded_bytes
    v.max_upload_rows = 6000
    v.add_frames([_frame(i, x=0.03 * i) for i in range(1, 11)])      # 48,000 new rows
    m = v.scene
    v.render_image()
    assert v.catching_up
    views, (first, n) = v.cloud.draw_plan
    live_from = m.first_row_of_frame(m.frames_added - LIVE_FRAMES)
    assert first == live_from and first + n == m.count              # the newest frames: drawn
    draws = 1
    while v.catching_up:
        v.render_image()
        draws += 1
        assert draws < 50
    assert draws >= 5                                               # 38,400 rows / 6,000 a draw
    # every new row went up once (28 B a row), nothing before them again
    assert v.cloud.uploaded_bytes - before == 28 * 48_000
    for k in range(LOD_LEVELS):
        assert np.array_equal(v.levels.host[k][: v.levels.used[k]], np.flatnonzero(m.level[: m.count] == k))


def test_level_lists_grow_without_uploading_again(qtbot, monkeypatch):
    """Growing a level's index list takes another fixed-size GPU block: every entry goes up
    once (O(new rows)), never again when a list outgrows its buffer, and the blocks in use are
    exactly those the entries need."""
    monkeypatch.setattr(cloud_visual, "INDEX_BLOCK", 512)
    v = _small_shown_viewer(qtbot)
    for i in range(12):                          # 4,800 rows a frame, a draw after each
        v.add_frames([_frame(i, x=0.03 * i)])
        v.render_image()
    m, lv = v.scene, v.levels
    assert not v.catching_up and m.thinning_passes == 0
    assert lv.uploaded_bytes == 4 * m.count               # each entry uploaded once
    assert max(lv.used) > 4 * 512                         # lists outgrew several blocks
    assert [len(b) for b in lv.blocks] == [-(-u // 512) for u in lv.used]
    assert v.index_blocks.created == sum(len(b) for b in lv.blocks) + len(v.index_blocks.free)
    for k in range(LOD_LEVELS):
        assert np.array_equal(lv.host[k][: lv.used[k]], np.flatnonzero(m.level[: m.count] == k))
        assert sum(c for _, c in lv.views(k, lv.used[k])) == lv.used[k]
