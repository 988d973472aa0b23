"""The vispy viewer: appends cost only the new points, styling is uniforms only, and a
re-alignment moves an already-drawn segment without re-uploading it (rendered, not mocked)."""
import numpy as np
import pytest

from engine.api import FrameResult

from ui.display import make_display_frame
from ui.viewer import PointCloudViewer

BYTES_PER_POINT = (3 + 1 + 1 + 2) * 4       # position, packed colour, confidence, depth+segment


def _frame(i, segment=0, w=80, h=60, x=0.0):
    c2w = np.eye(4)
    c2w[0, 3] = x
    K = np.array([[60.0, 0, (w - 1) / 2], [0, 60.0, (h - 1) / 2], [0, 0, 1]])
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 0] = 200
    img[..., 1] = np.linspace(0, 255, w, dtype=np.uint8)[None]
    depth = np.full((h, w), 2.0, np.float32)
    conf = np.tile(np.linspace(1, 10, w, dtype=np.float32), (h, 1))
    r = FrameResult(index=i, timestamp=i / 30, is_keyframe=True, c2w=c2w, K=K, image=img, depth=depth,
                    conf=conf, segment=segment)
    return make_display_frame(r, stride=1, frustum_depth=0.2)


def _lit(img):
    """Pixels that differ from the background colour."""
    bg = img[0, 0, :3].astype(int)
    return np.abs(img[..., :3].astype(int) - bg).sum(-1) > 30


@pytest.fixture
def viewer(qtbot):
    v = PointCloudViewer(capacity=1 << 14)
    qtbot.addWidget(v)
    v.resize(480, 360)
    v.show()
    qtbot.waitExposed(v)
    return v


def test_append_uploads_only_the_new_points(viewer):
    viewer.add_frames([_frame(0)])
    viewer.sync()                             # what every draw does first
    n = len(_frame(0).points)
    before = viewer.cloud.uploaded_bytes
    viewer.add_frames([_frame(1, x=0.1)])
    assert viewer.cloud.uploaded_bytes == before     # uploads wait for the next draw
    viewer.sync()
    assert viewer.point_count == viewer.cloud.count == 2 * n
    assert viewer.cloud.uploaded_bytes - before == n * BYTES_PER_POINT
    assert viewer.frustum_count == 2 and viewer.trajectory_count == 2


def test_hidden_view_queues_nothing(viewer):
    """vispy queues GL commands until a draw: a hidden or minimised view must not upload
    (the queue would grow for as long as it stays hidden); it catches up when drawn."""
    viewer.add_frames([_frame(0)])
    viewer.render_image()
    viewer.hide()
    queue = viewer.canvas.context.glir._shared._commands
    before = len(queue)
    for i in range(1, 40):
        viewer.add_frames([_frame(i, x=0.02 * i)])
    assert len(queue) == before
    viewer.show()
    viewer.reset_view()
    assert _lit(viewer.render_image()).sum() > 1000
    assert viewer.cloud.count == viewer.scene.count == 40 * len(_frame(0).points)


def test_growth_keeps_points_and_doubles_rarely(viewer):
    n = len(_frame(0).points)                 # 4800 points per frame, capacity 16384
    for i in range(10):
        viewer.add_frames([_frame(i, x=0.01 * i)])
        viewer.sync()                         # a draw per frame
    assert viewer.point_count == 10 * n
    assert viewer.cloud.capacity >= 10 * n
    # 16384 → 32768 → 65536: two regrowths for ten frames
    assert viewer.cloud._attrs["a_position"].full_uploads == 3
    pos = viewer.scene.positions[: viewer.point_count]
    assert np.allclose(pos[:n], _frame(0).points)
    assert _lit(viewer.render_image()).sum() > 1000


def test_point_budget_bounds_buffers_and_keeps_old_frames(qtbot):
    """Past the budget the scene model thins older frames: the GPU buffers stop growing, the
    rows the pass rewrote are uploaded once, and the first frames are still drawn."""
    v = PointCloudViewer(capacity=1 << 14, point_budget=100_000)
    qtbot.addWidget(v)
    v.resize(480, 360)
    v.show()
    qtbot.waitExposed(v)
    v.set_show_frustums(False)
    v.set_show_trajectory(False)
    v.current.visible = False
    n = len(_frame(0).points)
    for i in range(60):                       # 60 x 4800 = 288k points offered
        v.add_frames([_frame(i, x=0.08 * i)])
        v.sync()
        assert v.point_count <= 100_000 and v.cloud.capacity <= 100_000
    # a pass still running when the budget is full is never waited for: that frame keeps what fits
    assert v.scene.thinning_passes >= 1 and v.scene.points_added + v.scene.points_skipped == 60 * n
    assert v.buffer_bytes <= 100_000 * BYTES_PER_POINT + v.frustums.buffer_bytes \
        + v.trajectory.buffer_bytes + v.current.buffer_bytes
    v.reset_view()
    v.auto_fit = False
    img = v.render_image()
    while v.catching_up:                           # (rewritten rows go up a piece per draw)
        img = v.render_image()
    assert v.cloud.count == v.scene.count          # the GPU draws what the model holds
    lit = _lit(img)
    cols = np.flatnonzero(lit.any(0))
    assert lit.sum() > 1000
    # the strip spans from the first frame (x = 0) to the last (x = 4.7 + plane width): a view
    # that had dropped the oldest frames would leave the left part empty
    first = v.scene.frame[: v.scene.count].min()
    assert first == 0
    assert cols.max() - cols.min() > 0.6 * img.shape[1]


def test_overlays_stay_under_their_cap(qtbot):
    """The frustum and trajectory buffers are allocated once at the camera budget: past it the
    scene decimates old cameras and the overlays redraw inside the same buffers (issue #7: a
    long run's buffer bytes must not grow)."""
    from engine.scene import RECENT_CAMERAS
    from ui.viewer import FRUSTUM_VERTICES, TRAJECTORY_VERTICES
    budget = 2 * RECENT_CAMERAS
    v = PointCloudViewer(capacity=1 << 14, point_budget=100_000, camera_budget=budget)
    qtbot.addWidget(v)
    v.resize(320, 240)
    v.show()
    qtbot.waitExposed(v)
    v.set_all_frustums(True)
    fr_bytes, tr_bytes = v.frustums.buffer_bytes, v.trajectory.buffer_bytes
    for i in range(0, 3 * budget, 50):              # 1,200 frames in batches of 50
        v.add_frames([_frame(j, w=8, h=6, x=0.01 * j) for j in range(i, i + 50)])
        v.sync()
        assert v.frustum_count <= budget
        assert v.frustums.count <= FRUSTUM_VERTICES * budget == v.frustums.capacity
        assert v.trajectory.count <= TRAJECTORY_VERTICES * budget == v.trajectory.capacity
    assert v.frustums.count == FRUSTUM_VERTICES * v.frustum_count   # every kept camera drawn
    assert (v.frustums.buffer_bytes, v.trajectory.buffer_bytes) == (fr_bytes, tr_bytes)
    assert v.scene.cam_frame[: v.scene.camera_count].max() == 3 * budget - 1     # newest kept
    assert v.scene.cam_frame[0] == 0                                         # oldest still drawn


def test_hidden_overlays_upload_nothing_and_catch_up(viewer):
    """Hidden layers are not drawn, so vispy would queue their uploads for as long as they stay
    hidden: with frustums and trajectory off no camera is uploaded; showing them catches up."""
    viewer.add_frames([_frame(0)])
    viewer.sync()
    viewer.set_show_frustums(False)
    viewer.set_show_trajectory(False)
    before = viewer.frustums.uploaded_bytes + viewer.trajectory.uploaded_bytes
    for i in range(1, 20):
        viewer.add_frames([_frame(i, w=8, h=6, x=0.1 * i)])
        viewer.sync()
    assert viewer.frustums.uploaded_bytes + viewer.trajectory.uploaded_bytes == before
    viewer.set_show_trajectory(True)
    viewer.sync()
    assert viewer.frustums.count == 16 * 20 and viewer.trajectory.count == 2 * 19


def test_uniform_changes_do_not_reupload(viewer):
    viewer.add_frames([_frame(0)])
    viewer.reset_view()
    full = _lit(viewer.render_image()).sum()
    before = viewer.uploaded_bytes
    viewer.set_conf_threshold(5.5)            # hides the left half of the plane
    half = _lit(viewer.render_image()).sum()
    viewer.set_point_size(6)
    viewer.set_color_mode("confidence")
    coloured = viewer.render_image()
    viewer.set_color_mode("depth")
    viewer.set_color_mode("rgb")
    viewer.set_conf_threshold(-3e38)
    viewer.set_point_size(2)
    again = _lit(viewer.render_image()).sum()
    assert viewer.uploaded_bytes == before
    assert half < 0.8 * full
    assert again == full
    assert coloured[..., :3].std() > 5
    with pytest.raises(ValueError):
        viewer.set_color_mode("bogus")


def test_realign_moves_segment_without_reupload(viewer):
    viewer.add_frames([_frame(0, segment=0), _frame(1, segment=1, x=0.05)])
    viewer.set_show_frustums(False)
    viewer.reset_view()
    viewer.auto_fit = False
    both = viewer.render_image()
    before = viewer.uploaded_bytes
    T = np.eye(4)
    T[0, 3] = 100.0                          # move segment 1 far out of view
    viewer.apply_realign(1, T)
    moved = viewer.render_image()
    assert viewer.uploaded_bytes == before
    assert viewer.cloud.seg_uploads >= 1
    assert not np.array_equal(both, moved)
    # segment 0 still drawn; the absolute transform replaces the earlier one
    assert _lit(moved).sum() > 0
    viewer.apply_realign(1, np.eye(4))
    assert np.array_equal(viewer.render_image(), both)


def test_clear_and_screenshot(viewer, tmp_path):
    viewer.add_frames([_frame(0)])
    viewer.reset_view()
    path = tmp_path / "shot.png"
    img = viewer.screenshot(str(path))
    assert path.stat().st_size > 0 and _lit(img).sum() > 100
    viewer.clear()
    assert viewer.point_count == 0 and viewer.frustum_count == 0 and viewer.trajectory_count == 0
    assert _lit(viewer.render_image()).sum() == 0
