"""Bounded memory of the geometric engine over long runs: the loop-closure keyframe database,
pose graphs and correction state stop growing when the camera keeps revisiting the same places
(issue #8 / #7). Real frames: the ICL clip replayed in a loop (each replay starts with a jump back,
i.e. a new segment that relocalises into the first one)."""
import numpy as np
import pytest

from engine.api import EngineError, SessionConfig, open_session
from engine.geometric.loop import Forget, LoopCloser, LoopParams
from engine.geometry import apply_realignments
from engine.metrics import ate
from tests.engine.accuracy import check
from tests.engine.geometric_drift import inject_scale_drift, replay, rgb_sequence


@pytest.fixture(scope="module")
def icl():
    return rgb_sequence("icl_livingroom_kt3")


def test_looped_replay_stops_growing(icl):
    """Five passes of the clip: after the second pass the database, the closer's nodes and edges
    and the session's correction state are no larger than after it (they would grow by ~13
    keyframes per pass without culling); every replay is placed in the first pass's map, and
    the trajectory stays right under one Sim(3)."""
    seq, frames = icl
    n, passes = len(frames), 5
    s = open_session(SessionConfig(engine="geometric", intrinsics=seq.intrinsics.as_tuple(), depth=False))
    res, ev, mem = [], [], []
    for p in range(passes):
        for i in range(n):
            res += s.push(frames[i], (p * n + i) / 30.0)
            ev += s.poll_events()
        mem.append(s.memory(settle=True))
    res += s.flush()
    ev += s.poll_events()
    st = s.stats()
    s.close()
    assert len(res) == passes * n
    assert st["segments"] == passes and st["segments_relocalised"] == passes - 1
    first = mem[0]["loop_database"]
    assert 5 <= first <= 40
    bounded = ("loop_database", "loop_nodes", "loop_edges", "loop_segments", "loop_estimates",
               "poses", "anchors", "sent", "links", "loop_node_bytes")
    for m in mem[2:]:
        for k in bounded:
            assert m[k] <= mem[1][k], (k, [x[k] for x in mem])
    assert mem[-1]["loop_database"] <= first + 3            # revisits are not stored again
    assert mem[-1]["loop_culled"] >= 3 * (passes - 2)       # ... they were culled
    order = [i for _ in range(passes) for i in range(n)]
    rr = sorted(apply_realignments(res, ev), key=lambda r: r.index)
    err = ate(np.array([r.c2w for r in rr]), np.array([seq.gt_c2w[order[r.index]] for r in rr]))["rmse"]
    check(("ATE m", err, "<", 0.03))


def _closer(n_nodes, segment_of, max_keyframes):
    lc = LoopCloser(np.eye(3), LoopParams(max_keyframes=max_keyframes))
    for f in range(n_nodes):
        lc.add_keyframe(f, segment_of(f), np.eye(4), lambda g: np.eye(4), np.zeros((0, 2)), np.zeros((0, 3)),
                        None, {}, 0)
    return lc


def test_database_cap_evicts_the_most_similar_and_forgets_ended_segments():
    lc = _closer(12, lambda f: 0 if f < 6 else 1, max_keyframes=10)
    for f, sim in enumerate([0.1, 0.9, 0.2, 0.3, 0.95, 0.1, 0.5, 0.5, 0.2, 0.1, 0.1, 0.1]):
        lc.nodes[f].similarity = sim
    end = lc.end_segment(0)                      # segment 0 ended with all 6 keyframes in the database
    assert isinstance(end, Forget) and end.segment == 0 and end.kept == list(range(6)) and end.fids == []
    assert 0 not in lc.edges and lc.by_segment[0] == list(range(6))
    lc._cap()
    assert list(lc.db) == [0, 2, 3, 5, 6, 7, 8, 9, 10, 11] and lc.keyframes_evicted == 2
    # 4 and 1 (the most similar) were in the ended segment: gone for good, and reported
    assert 4 not in lc.nodes and 1 not in lc.nodes and sorted(lc._forgotten) == [(1, 0), (4, 0)]
    lc.p.max_keyframes = 8
    lc._cap()                                    # 6 and 7 tie on similarity: the older goes first
    assert 6 not in lc.db and 7 not in lc.db and lc.nodes[6].desc is None
    assert 6 in lc.nodes                         # segment 1 is live: still a pose-graph node
    end = lc.end_segment(1)
    assert sorted(end.fids) == [6, 7] and end.kept == [8, 9, 10, 11]
    assert 6 not in lc.nodes and 6 not in lc.T_est and len(lc.nodes) == len(lc.db) == 8


def test_loop_keyframes_setting_is_checked():
    with pytest.raises(EngineError, match="loop_max_keyframes"):
        s = open_session(SessionConfig(engine="geometric", loop_max_keyframes=3))
        s.push(np.zeros((64, 64, 3), np.uint8))


def test_pose_graph_compaction_keeps_loop_closure_working(icl, monkeypatch):
    """ICL forward-backward twice (800 frames, one segment) with an artificial scale drift of 1 %
    per keyframe, the live pose graph capped at 10 nodes beyond the database: redundant keyframes
    are merged into their predecessors (their edges re-attached), the graph stops at database +
    the 4 latest nodes, and the loops still correct the drift (0.76 cm uncapped, 0.92 cm capped)."""
    inject_scale_drift(monkeypatch)
    seq, frames = icl
    order = (list(range(200)) + list(range(199, -1, -1))) * 2
    res, ev, st, m = replay(seq, frames, order, depth=False,
                            extra={"loop_max_graph_nodes": 10, "loop_keep_recent": 4})
    assert len(res) == len(order) and {r.segment for r in res} == {0}
    assert st["loops_closed"] >= 10 and m["loop_culled"] >= 10
    assert m["loop_nodes"] <= m["loop_database"] + 4 + 1 and m["poses"] == m["loop_nodes"]
    rr = sorted(apply_realignments(res, ev), key=lambda r: r.index)
    err = ate(np.array([r.c2w for r in rr]), np.array([seq.gt_c2w[order[r.index]] for r in rr]))["rmse"]
    check(("ATE m", err, "<", 0.015))
