"""Loop closures reach the viewer: frame-range "realign" events (engine.api.EngineEvent.frames)
move exactly the frames they cover, live and in a reopened session, and the cameras are drawn
where engine.geometry places them for the exports."""
import numpy as np

from tests.ui.conftest import wait_finished

FRAMES, LOOP_AT = 10, 6


def _drawn_camera_centres(viewer):
    """input index -> camera centre as drawn: each frustum's apex vertex (host mirror of the
    vertex buffer) times its frame's matrix in the transform texture (host mirror of the GPU)."""
    viewer.sync()
    fr = viewer.frustums
    n = fr.count // 16
    pos = fr._attrs["a_position"].host[: 16 * n: 16].astype(np.float64)
    fid = fr._attrs["a_depth_seg"].host[: 16 * n: 16, 1].astype(np.int64)
    mats = np.transpose(viewer.frame_xf.host.reshape(-1, 4, 4)[fid], (0, 2, 1)).astype(np.float64)
    world = np.einsum("nij,nj->ni", mats[:, :3, :3], pos) + mats[:, :3, 3]
    index = viewer.scene.cam_index[: viewer.scene.camera_count]
    assert len(index) == n
    return dict(zip(index.tolist(), world))


def _export_centres(folder):
    from engine.geometry import apply_realignments
    from engine.io.store import load_session
    s = load_session(folder)
    assert any(getattr(e, "frames", None) for e in s.events)        # the store kept the ranges
    return {r.index: r.c2w[:3, 3] for r in apply_realignments(s.results, s.events)}, s


def _assert_same(drawn, expected):
    assert sorted(drawn) == sorted(expected) == list(range(FRAMES))
    for i in drawn:
        assert np.allclose(drawn[i], expected[i], atol=1e-4), (i, drawn[i], expected[i])


def test_loop_closure_moves_the_drawn_cameras_as_the_export(qtbot, make_window, shared_data):
    w = make_window(extra={"loop_at": LOOP_AT})
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(FRAMES)
    w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"] is None and s["results"] == FRAMES
    expected, loaded = _export_centres(w.session_folder)
    raw = {r.index: r.c2w[:3, 3] for r in loaded.results}
    moved = [i for i in raw if not np.allclose(raw[i], expected[i])]
    assert moved == list(range(LOOP_AT))           # the events cover frames 0..5, not 6..9
    drawn = _drawn_camera_centres(w.viewer)
    _assert_same(drawn, expected)
    # a frame's points move with it, by the similarity engine.geometry gives that frame
    from engine.geometry import result_transforms
    m = w.viewer.scene
    world = m.world_positions()
    fseq = m.frame[: m.count]
    Ts = result_transforms([(0, int(i)) for i in m.cam_index[:FRAMES]], loaded.events)
    for seq in range(FRAMES):
        p = m.positions[: m.count][fseq == seq].astype(np.float64)
        T = np.eye(4) if Ts[seq] is None else Ts[seq]
        assert len(p) and np.allclose(world[fseq == seq], p @ T[:3, :3].T + T[:3, 3], atol=1e-5)
        assert (Ts[seq] is None) == (seq >= LOOP_AT)

    # the review timeline rebuilds the view from the store: corrected cameras up to frame 7
    w.review.scrub_to(7, mode="accumulated")
    sub = _drawn_camera_centres(w.viewer)
    assert sorted(sub) == list(range(8))
    assert all(np.allclose(sub[i], expected[i], atol=1e-4) for i in sub)
    w.review.go_live()

    # reopening the session (File > Open session) draws the same corrected cameras
    assert w.open_session_folder(w.session_folder)
    _assert_same(_drawn_camera_centres(w.viewer), expected)


def test_frame_range_realign_rewrites_texture_rows_not_points(qtbot, make_window, shared_data):
    w = make_window()
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(FRAMES)
    w.start_run()
    wait_finished(qtbot, w)
    v = w.viewer
    v.set_show_frustums(False)
    v.auto_fit = False
    before_img = v.render_image()
    before = v.uploaded_bytes
    T = np.eye(4)
    T[0, 3] = 100.0                                # frames 2..4 far out of view
    v.apply_realign(0, T, frames=(2, 4))
    img = v.render_image()
    assert v.uploaded_bytes == before              # no vertex re-upload
    assert not np.array_equal(img, before_img)
    world = v.scene.world_positions()
    f = v.scene.frame[: v.scene.count]
    moved = (f >= 2) & (f <= 4)
    assert np.allclose(world[moved], v.scene.positions[: v.scene.count][moved] + [100, 0, 0], atol=1e-4)
    assert np.allclose(world[~moved], v.scene.positions[: v.scene.count][~moved], atol=1e-6)
