"""The viewer's level of detail: with an (injected) cost per point that says the full cloud
misses the frame-time target it draws a draw-order prefix plus the newest frames in full, and
everything once the view has stood still; the per-level index lists follow thinning."""
import numpy as np
import pytest

from engine.scene import LOD_LEVELS
from ui.viewer import LIVE_FRAMES, PointCloudViewer
from tests.ui.test_ui_viewer import _frame, _lit


@pytest.fixture
def viewer(qtbot):
    v = PointCloudViewer(capacity=1 << 14)
    qtbot.addWidget(v)
    v.resize(480, 360)
    v.show()
    qtbot.waitExposed(v)
    v.measure_cost = False
    return v


def _fill(v, frames=12):
    v.add_frames([_frame(i, x=0.03 * i) for i in range(frames)])


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
    # the newest LIVE_FRAMES frames in full, whatever the detail
    assert first == m.first_row_of_frame(m.frames_added - LIVE_FRAMES) and first + n == m.count
    assert set(np.unique(m.frame[first:m.count])) == set(range(m.frames_added - LIVE_FRAMES, m.frames_added))
    # before them: whole levels 0..j of the draw order, from the per-level index lists
    j = len(views) - 1
    rows = np.sort(np.concatenate([viewer.levels.host[k][:cnt] for k, (_, cnt) in enumerate(views)]))
    assert np.array_equal(rows, m.draw_prefix(j, first))
    assert viewer.drawn_points == len(rows) + n
    # it is drawn (indexed draws reach the screen) and covers about the same area, not a corner
    lit_full, lit_red = _lit(full).sum(), _lit(reduced).sum()
    assert 0.5 * lit_full < lit_red <= lit_full


def test_still_view_is_refined_to_full_detail(viewer, qtbot):
    _fill(viewer)
    viewer.render_image()
    viewer.cost_per_point_ms = viewer.frame_time_target_ms / (0.3 * viewer.point_count)
    viewer.canvas.update()
    qtbot.waitUntil(lambda: viewer.detail_reduced, timeout=10_000)
    # nothing moves: the idle refinement draws everything
    qtbot.waitUntil(lambda: viewer.drawn_points == viewer.point_count, timeout=20_000)
    assert not viewer.detail_reduced and viewer.cloud.draw_plan is None
    # the camera moves: reduced again
    viewer.view.camera.azimuth += 30.0
    viewer.render_image()
    assert viewer.detail_reduced


def test_cheap_points_draw_everything(viewer):
    _fill(viewer)
    viewer.cost_per_point_ms = 1e-9
    viewer.render_image()
    assert viewer.cloud.draw_plan is None and viewer.drawn_points == viewer.point_count


def test_level_index_follows_thinning(qtbot):
    v = PointCloudViewer(capacity=1 << 14, point_budget=100_000)
    qtbot.addWidget(v)
    v.resize(320, 240)
    v.show()
    qtbot.waitExposed(v)
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
