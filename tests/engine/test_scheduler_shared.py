"""SharedStreams (engine/shared_streams.py): sessions of one scheduler pushed from several threads
give exactly the results of each stream run alone, share rounds, and fail one at a time."""
import threading

import numpy as np
import pytest

from engine import EngineError
from engine.shared_streams import SharedStreams
from tests.engine.test_scheduler import _alone, _cfg, _frames, tiny  # noqa: F401 (tiny: fixture)


def _worker(session, frames, out, errors):
    try:
        for f in frames:
            out.extend(session.push(f))
        out.extend(session.flush())
    except EngineError as exc:
        errors.append(str(exc))
    finally:
        session.close()


@pytest.mark.parametrize("pipeline", [False, True])
def test_threads_share_rounds_and_match_each_stream_alone(tiny, pipeline):
    specs = {"a": (dict(), _frames(1, 9)), "b": (dict(keyframe_interval=2), _frames(2, 8)),
             "c": (dict(), _frames(3, 7))}
    ref = {k: _alone(tiny, over, fr) for k, (over, fr) in specs.items()}
    hub = SharedStreams(tiny, max_batch=4, gather_s=0.5, pipeline=pipeline)
    assert hub.scheduler.pipeline == pipeline
    sessions = {k: hub.open_session(_cfg(**over), name=k) for k, (over, _) in specs.items()}
    got = {k: [] for k in specs}
    errors: list = []
    threads = [threading.Thread(target=_worker, args=(sessions[k], specs[k][1], got[k], errors)) for k in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert hub.scheduler.stats()["largest_batch"] >= 2       # the threads' frames shared forwards
    for k in specs:
        a, b = ref[k], got[k]
        assert [r.index for r in a] == [r.index for r in b] and len(b) == len(specs[k][1])
        for x, y in zip(a, b):
            np.testing.assert_allclose(y.pose_enc, x.pose_enc, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(y.depth, x.depth, rtol=1e-5, atol=1e-6)
    assert all(s.closed for s in sessions.values()) and hub.open_sessions() == 0


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_bad_frame_ends_only_its_session(tiny, pipeline):
    hub = SharedStreams(tiny, max_batch=4, gather_s=0.0, pipeline=pipeline)
    a, b = hub.open_session(_cfg(), name="a"), hub.open_session(_cfg(), name="b")
    fa, fb = _frames(5, 4), _frames(6, 5)
    fa[3] = _frames(7, 1, shape=(60, 120, 3))[0]            # another size mid-stream
    out_a, out_b, err_a, err_b = [], [], [], []
    ta = threading.Thread(target=_worker, args=(a, fa, out_a, err_a))
    tb = threading.Thread(target=_worker, args=(b, fb, out_b, err_b))
    ta.start(), tb.start()
    ta.join(120), tb.join(120)
    assert len(err_a) == 1 and "frame size changed" in err_a[0] and not err_b
    assert [r.index for r in out_a] == [0, 1, 2] and [r.index for r in out_b] == list(range(5))
    stats = b.stats() if not b.closed else None
    assert stats is None
    with pytest.raises(EngineError, match="frame size changed"):
        a.push(fa[0])


def test_stats_and_session_facts_pass_through(tiny):
    hub = SharedStreams(tiny, gather_s=0.0)
    s = hub.open_session(_cfg(), name="x")
    for f in _frames(8, 3):
        s.push(f)
    st = s.stats()
    assert st["frames"] == 3 and st["scheduler"]["streams"] == 1
    assert s.config.image_width == 70 and s.kv is not None     # the session's own attributes
    s.close()
    assert s.closed and hub.open_sessions() == 0


def test_a_stream_that_stopped_pushing_is_not_waited_for(tiny, monkeypatch):
    import time
    monkeypatch.setattr(SharedStreams, "ACTIVE_S", 0.1)
    hub = SharedStreams(tiny, gather_s=30.0)           # would wait 30 s for an active stream
    a, b = hub.open_session(_cfg(), name="a"), hub.open_session(_cfg(), name="b")
    b.push(_frames(9, 1)[0])                            # b pushes once, then pauses
    time.sleep(0.2)
    t0 = time.monotonic()
    for f in _frames(10, 4):
        a.push(f)
    assert time.monotonic() - t0 < 25                   # no 30 s gather for the paused stream
    a.close(), b.close()


def test_stats_after_flush_still_show_the_final_page_map(tiny):
    """flush() ends a shared stream (its caches are freed); the run's final stats are read after it
    (engine.run_driver), so the KV page map the monitors draw must be the one at the end, not None --
    a short run whose 4 Hz stats never fired mid-run showed no page map at all."""
    hub = SharedStreams(tiny, gather_s=0.0)
    s = hub.open_session(_cfg(), name="x")
    for f in _frames(8, 6):
        s.push(f)
    live = s.stats()
    s.flush()
    st = s.stats()
    assert s.closed and s.kv is None
    assert st["kv_page_map"] is not None and st["kv"] is not None
    assert st["frames"] == 6
    assert (np.asarray(st["kv_page_map"]) > 0).sum() >= (np.asarray(live["kv_page_map"]) > 0).sum() > 0
    assert st["kv"]["bytes_allocated"] == live["kv"]["bytes_allocated"] > 0
