"""benchmarks/tracking_trace.py: the per-frame trace of the tracker that located kt0's scale break
(docs/benchmarks_geometric.md). Checked on 70 frames of the shared ICL clip cut out of its middle:
the cut is a sequence of its own, the trace covers every frame the tracker posed after its start,
its keyframe flags agree with the run's results, and the tracker is left as it was."""
import numpy as np
import pytest

from benchmarks import tracking_trace as tt
from engine.evaluate import load_sequence
from engine.geometric import tracker as T
from tests.conftest import DATA


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not DATA.is_dir():
        pytest.fail(f"shared data not found at {DATA}")
    src = DATA / "icl_livingroom_kt3"
    seq_dir = tt.sub_sequence(str(src), 60, 130, str(tmp_path_factory.mktemp("cut") / "seq"))
    before = (T.MonoTracker._pnp, T.MonoTracker._track, T.MonoTracker._make_keyframe, T.triangulate)
    rep, results, log = tt.trace_run(seq_dir, {"depth": "false", "loop_closure": "false"})
    after = (T.MonoTracker._pnp, T.MonoTracker._track, T.MonoTracker._make_keyframe, T.triangulate)
    return src, seq_dir, rep, results, log, before, after


def test_the_cut_is_the_middle_of_the_sequence(run):
    src, seq_dir, *_ = run
    full, cut = load_sequence(src), load_sequence(seq_dir)
    assert len(cut) == 70
    assert np.allclose(cut.gt_c2w, full.gt_c2w[60:130])
    assert cut.frames[0].resolve() == full.frames[60].resolve()
    assert cut.intrinsics.as_tuple() == full.intrinsics.as_tuple()


def test_the_trace_covers_the_tracked_frames_and_its_keyframes(run):
    _, _, rep, results, log, before, after = run
    assert after == before                     # the instrumentation is removed again
    assert rep["posed"] == 70 and rep["ate_rmse_m"] < 0.03
    # frames posed by tracking (after the map's start) are each in the trace, with the
    # keyframe decision the results carry
    first_tracked = min(log)
    tracked = [r for r in results if r.index >= first_tracked]
    assert len(log) == len(tracked) > 30
    assert [log[r.index]["keyframe"] for r in tracked] == [r.is_keyframe for r in tracked]
    kf = [f for f, r in log.items() if r["keyframe"]]
    assert kf and all("new_points" in log[f] and "reused" in log[f] for f in kf)
    assert all(r["inliers"] <= r["known"] <= r["tracks"] for r in log.values())


def test_window_scales_and_summary(run):
    _, seq_dir, _, results, log, _, _ = run
    wins = tt.window_scales(results, load_sequence(seq_dir).gt_c2w, 30)
    assert [f for f, _ in wins] == [0, 30]     # the last window of 10 frames is under half a window
    s = [x for _, x in wins]
    assert all(x is not None and x > 0 for x in s)
    assert abs(np.log(s[1] / s[0])) < np.log(1.2)   # a good clip holds its scale
    summ = tt.summary(log, 0, 70)
    assert summ["frames"] == len(log) and summ["keyframes"] == sum(r["keyframe"] for r in log.values())
