"""The stream layer (engine/shared_streams.py) every run goes through: a stream alone is its
session's own push (same results bit for bit, no scheduler round), a stream that gains or loses
company switches between that and batched rounds with its results complete and in order, also
while results are deferred (the CUDA fast path, forced here on the CPU), and engines that share
no model get an ordinary session."""
import numpy as np
import pytest

from engine import EngineError, SessionConfig, open_session
from engine.shared_streams import SharedSession, SharedStreams, StreamHubs
from tests.engine.test_scheduler import _cfg, _frames, tiny  # noqa: F401 (tiny: fixture)


def _alone(model, frames, defer=False, **over):
    s = open_session(_cfg(**over), model=model)
    s.defer_results = defer
    res = [r for f in frames for r in s.push(f)] + s.flush()
    s.close()
    return res


def _same(got, ref):
    assert [r.index for r in got] == [r.index for r in ref]
    for x, y in zip(ref, got):
        np.testing.assert_array_equal(y.pose_enc, x.pose_enc)
        np.testing.assert_array_equal(y.depth, x.depth)
        np.testing.assert_array_equal(y.conf, x.conf)
        np.testing.assert_array_equal(y.c2w, x.c2w)
        assert y.is_keyframe == x.is_keyframe


@pytest.mark.parametrize("defer", [False, True])
def test_a_stream_alone_is_its_sessions_own_push(tiny, monkeypatch, defer):
    frames = _frames(21, 6)
    ref = _alone(tiny, frames, defer=defer, keyframe_interval=2)
    hub = SharedStreams(tiny, gather_s=0.0, pipeline=True)
    s = hub.open_session(_cfg(keyframe_interval=2), name="solo")
    s.stream.session.defer_results = defer
    from engine import scheduler
    monkeypatch.setattr(scheduler.StreamScheduler, "_batched", lambda *a: pytest.fail("a lone stream was batched"))
    got, per_push = [], []
    for f in frames:
        out = s.push(f)
        per_push.append([r.index for r in out])
        got += out
    got += s.flush()
    _same(got, ref)
    # deferred: a streamed frame's results come out of the next push, exactly as the session alone
    expect = [[], [0, 1], [], [2], [3], [4]] if defer else [[], [0, 1], [2], [3], [4], [5]]
    assert per_push == expect
    st = hub.scheduler.stats()
    assert st["rounds"] == 6 and st["batched_frames"] == 0 and st["largest_batch"] == 1


def test_switching_between_alone_and_batched_keeps_every_result_in_order(tiny):
    fa, fb = _frames(31, 9), _frames(32, 4)
    ref_a, ref_b = _alone(tiny, fa, defer=True), _alone(tiny, fb)
    hub = SharedStreams(tiny, gather_s=0.0, pipeline=True)
    a = hub.open_session(_cfg(), name="a")
    a.stream.session.defer_results = True       # the CUDA path: results in flight across the switch
    got_a, got_b = [], []
    for f in fa[:4]:                             # alone: frame 3's results still in flight
        got_a += a.push(f)
    assert [r.index for r in got_a] == [0, 1, 2]
    b = hub.open_session(_cfg(), name="b")       # company: a's next frames go through rounds
    for i in range(4):
        got_a += a.push(fa[4 + i])
        got_b += b.push(fb[i])
    got_b += b.flush()
    b.close()
    assert hub.scheduler.stats()["batched_frames"] >= 4
    for f in fa[8:]:                             # alone again: the rounds in flight come out first
        got_a += a.push(f)
    got_a += a.flush()
    _same(got_a, ref_a)
    _same(got_b, ref_b)


def test_a_failing_frame_alone_still_returns_the_frames_before_it(tiny):
    hub = SharedStreams(tiny, gather_s=0.0)
    s = hub.open_session(_cfg(), name="x")
    s.stream.session.defer_results = True
    got = []
    for f in _frames(41, 4):
        got += s.push(f)
    got += s.push(_frames(42, 1, shape=(60, 120, 3))[0])     # another size mid-stream
    assert [r.index for r in got] == [0, 1, 2, 3]             # frame 3 was still in flight
    with pytest.raises(EngineError, match="frame size changed"):
        s.push(_frames(43, 1)[0])
    assert s.closed and hub.open_sessions() == 0


def test_stream_hubs_open_every_engine(tiny):
    hubs = StreamHubs(preloaded=tiny)
    shared = hubs.open_session(_cfg())
    plain = hubs.open_session(SessionConfig(engine="synthetic", image_width=56))
    assert isinstance(shared, SharedSession) and not isinstance(plain, SharedSession)
    assert hubs.open_streams() == 1
    shared.close(), plain.close()
    assert hubs.open_streams() == 0


def test_the_stream_layer_costs_a_geometric_run_no_torch():
    """Every run opens its session through StreamHubs; one that shares no network (the geometric
    engine) must not pay for torch (~0.2 GB of RSS), which only the first SharedStreams loads."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys\n"
            "from engine import SessionConfig\n"
            "from engine.shared_streams import StreamHubs\n"
            "s = StreamHubs().open_session(SessionConfig(engine='geometric'))\n"
            "s.close()\n"
            "print(type(s).__name__, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["GeometricSession", "False"]
