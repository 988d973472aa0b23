"""The batching stream scheduler (engine/scheduler.py) on lingbot-map-tiny."""
import numpy as np
import pytest

from engine import EngineError, SessionConfig, open_session
from engine.model_zoo import build_model
from engine.models.recipe import fill_recipe
from engine.scheduler import AdmissionError, StreamScheduler, stream_cache_bytes


@pytest.fixture(scope="module")
def tiny():
    return fill_recipe(build_model("lingbot-map-tiny"))


def _frames(seed, n, shape=(60, 80, 3)):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(n)]


def _cfg(**kw):
    base = dict(engine="lingbot-map", image_width=70, scale_frames=2, window=3, special_cap=8,
                keyframe_interval=1, camera_iterations=2)
    base.update(kw)
    return SessionConfig(**base)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


# stream name -> (config overrides, frames); "c" has another aspect (its own batch group), "b"
# keeps every 2nd frame only (non-keyframes roll back inside a batch)
STREAMS = {
    "a": (dict(), dict(seed=1, n=9)),
    "b": (dict(keyframe_interval=2), dict(seed=2, n=9)),
    "c": (dict(scale_frames=3), dict(seed=3, n=7, shape=(60, 100, 3))),
    "d": (dict(), dict(seed=4, n=8)),
}


def _alone(model, over, frames):
    s = open_session(_cfg(**over), model=model)
    res = [r for f in frames for r in s.push(f)] + s.flush()
    s.close()
    return res


def test_batched_streams_equal_each_stream_run_alone(tiny):
    frames = {k: _frames(**fr) for k, (_, fr) in STREAMS.items()}
    ref = {k: _alone(tiny, over, frames[k]) for k, (over, _) in STREAMS.items()}
    sched = StreamScheduler(tiny, max_batch=8)
    streams = {k: sched.open_stream(_cfg(**over), name=k) for k, (over, _) in STREAMS.items()}
    got = {k: [] for k in STREAMS}
    for i in range(max(len(f) for f in frames.values())):      # frames arrive interleaved
        for k, st in streams.items():
            if i < len(frames[k]):
                sched.submit(st, frames[k][i])
        for st, res in sched.step():
            got[st.name].extend(res)
    for k, st in streams.items():
        got[k].extend(sched.close_stream(st))
    stats = sched.stats()
    assert stats["largest_batch"] == 3                   # a, b, d share a forward; c has its own
    assert stats["rounds"] < sum(len(f) for f in frames.values())
    for k in STREAMS:
        a, b = ref[k], got[k]
        assert [r.index for r in a] == [r.index for r in b] and len(a) == len(frames[k])
        assert [r.is_keyframe for r in a] == [r.is_keyframe for r in b]
        for x, y in zip(a, b):
            np.testing.assert_allclose(y.pose_enc, x.pose_enc, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(y.depth, x.depth, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(y.conf, x.conf, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(y.c2w, x.c2w, rtol=1e-5, atol=1e-5)
            assert y.timestamp == x.timestamp
    assert all(s["error"] is None and s["served"] == len(frames[s["name"]]) for s in stats["streams"])


def _streaming_scheduler(tiny, names, clock=None, **kw):
    """Scheduler whose streams have finished their scale phase (2 frames each)."""
    sched = StreamScheduler(tiny, clock=clock or FakeClock(), **kw)
    out = {}
    for n in names:
        st = sched.open_stream(_cfg(), name=n)
        out[n] = st
        for f in _frames(7, 2):
            sched.submit(st, f)
    while sched.pending():
        sched.step()
    return sched, out


def test_round_robin_is_fair(tiny):
    sched, st = _streaming_scheduler(tiny, "abc", max_batch=1)
    for s in st.values():
        for f in _frames(8, 3):
            sched.submit(s, f)
    order = []
    while sched.pending():
        order += [s.name for s, _ in sched.step()]
    assert len(order) == 9
    assert all(sorted(order[i:i + 3]) == ["a", "b", "c"] for i in range(0, 9, 3))   # each round once
    sched2, st2 = _streaming_scheduler(tiny, "ab", max_batch=2)
    for s in st2.values():
        sched2.submit(s, _frames(9, 1)[0])
    served = sched2.step()
    assert sorted(s.name for s, _ in served) == ["a", "b"] and all(len(r) == 1 for _, r in served)


def test_latency_budget_serves_the_late_stream_first_and_live_streams_drop(tiny):
    clock = FakeClock()
    sched, st = _streaming_scheduler(tiny, "abc", clock=clock, max_batch=1)
    st["c"].latency_budget_s = 0.050
    f = _frames(10, 4)
    sched.submit(st["c"], f[0])                  # c's frame waits since t = 0
    clock.t = 0.010
    sched.submit(st["a"], f[1])
    sched.submit(st["b"], f[2])
    clock.t = 0.100                              # c is past its 50 ms budget
    assert [s.name for s, _ in sched.step()] == ["c"]
    assert st["c"].stats()["budget_misses"] == 1
    # a live stream keeps only the newest frame once older ones are past its budget
    live = st["a"]
    live.live, live.latency_budget_s = True, 0.020
    for i in range(3):
        clock.t = 0.2 + 0.05 * i
        sched.submit(live, f[3])
    clock.t = 0.35
    while sched.pending():
        sched.step()
    assert live.dropped == 3 and live.stats()["dropped"] == 3   # the older a-frame too


def test_admission_refuses_a_stream_whose_caches_do_not_fit(tiny):
    cfg = _cfg(window=3)
    est = stream_cache_bytes(tiny, cfg, (80, 60))
    sched = StreamScheduler(tiny, memory_budget_bytes=int(est["total"] * 1.5))
    a = sched.open_stream(cfg, name="cam0", frame_size=(80, 60))
    with pytest.raises(AdmissionError) as err:
        sched.open_stream(cfg, name="cam1", frame_size=(80, 60))
    msg = str(err.value)
    assert "cannot open stream 'cam1'" in msg and "window 3" in msg and "1 stream(s) open" in msg
    assert "Lower the window" in msg
    # the estimate is what the caches really allocate
    for f in _frames(11, 3):
        sched.submit(a, f)
    while sched.pending():
        sched.step()
    assert a.session.kv.stats()["bytes_allocated"] == est["kv"]
    assert a.session.camera_cache.stats()["bytes_allocated"] == est["camera"]
    sched.close_stream(a)                        # its memory is free again
    sched.open_stream(cfg, name="cam1", frame_size=(80, 60))
    with pytest.raises(AdmissionError, match="geometric"):
        sched.open_stream(SessionConfig(engine="geometric"))


def test_a_bad_frame_fails_only_its_stream(tiny):
    sched, st = _streaming_scheduler(tiny, "ab")
    sched.submit(st["a"], _frames(12, 1, shape=(60, 120, 3))[0])     # other size mid-stream
    sched.submit(st["b"], _frames(12, 1)[0])
    served = dict((s.name, r) for s, r in sched.step())
    assert served["a"] == [] and "frame size changed" in st["a"].error
    assert len(served["b"]) == 1 and st["b"].error is None
    with pytest.raises(EngineError, match="closed"):
        sched.close_stream(st["a"]) or sched.submit(st["a"], _frames(12, 1)[0])


def test_a_stream_shorter_than_its_scale_phase_runs_it_at_close(tiny):
    frames = _frames(13, 2)
    ref = _alone(tiny, dict(scale_frames=3), frames)
    sched = StreamScheduler(tiny)
    st = sched.open_stream(_cfg(scale_frames=3), name="short")
    for f in frames:
        sched.submit(st, f)
    assert [r for _, res in sched.step() for r in res] == []        # still buffering
    got = sched.close_stream(st)
    assert [r.index for r in got] == [0, 1] and st.closed and st.session.kv is None
    np.testing.assert_allclose(np.stack([r.pose_enc for r in got]), np.stack([r.pose_enc for r in ref]),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(EngineError, match="positive"):
        sched.open_stream(_cfg(), latency_budget_ms=0)


def test_pipelined_rounds_equal_each_stream_alone_one_round_later(tiny):
    names = ("a", "b", "d")                 # one batch group (same size and iterations)
    frames = {k: _frames(**STREAMS[k][1]) for k in names}
    ref = {k: _alone(tiny, STREAMS[k][0], frames[k]) for k in names}
    sched = StreamScheduler(tiny, max_batch=8, pipeline=True)
    streams = {k: sched.open_stream(_cfg(**STREAMS[k][0]), name=k) for k in names}
    got = {k: [] for k in names}
    late = []                               # streamed rounds whose results came with the next step
    for i in range(max(len(f) for f in frames.values())):
        for k, st in streams.items():
            if i < len(frames[k]):
                sched.submit(st, frames[k][i])
        served = sched.step()
        for st, res in served:
            got[st.name].extend(res)
        if i >= 3:                          # streaming: this step's own frames are in flight
            assert sched.pending() == sum(i < len(frames[k]) for k in names)
            late.append(sum(len(r) for _, r in served))
    assert late[0] == 3                     # the round before, for all three streams
    for k, st in streams.items():
        got[k].extend(sched.close_stream(st))
    assert sched.pending() == 0 and sched.stats()["pipeline"]
    assert set(sched.stats()["host_ms_per_round"]) == {"prepare", "launch", "readback", "results"}
    for k in names:
        a, b = ref[k], got[k]
        assert [r.index for r in a] == [r.index for r in b] and len(b) == len(frames[k])
        for x, y in zip(a, b):
            np.testing.assert_allclose(y.pose_enc, x.pose_enc, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(y.depth, x.depth, rtol=1e-5, atol=1e-6)
            assert y.is_keyframe == x.is_keyframe and y.timestamp == x.timestamp


def test_pipelined_close_of_one_stream_keeps_the_others_results(tiny):
    sched, st = _streaming_scheduler(tiny, "ab", pipeline=True)
    fa, fb = _frames(20, 3), _frames(21, 3)
    ref_sched, ref_st = _streaming_scheduler(tiny, "ab")
    want = {}
    for s_, f in ((ref_st["a"], fa), (ref_st["b"], fb)):
        for x in f:
            ref_sched.submit(s_, x)
    for s_, res in ref_sched.run_until_idle().items():
        want[s_] = res
    for x, y in zip(fa, fb):
        sched.submit(st["a"], x)
        sched.submit(st["b"], y)
    first = sched.step()                          # launches a+b, nothing back yet (scale phases done)
    assert first == []
    closing = sched.close_stream(st["a"])         # a's frames, b's results held meanwhile
    rest = sched.run_until_idle()
    got_b = rest.get("b", [])
    assert [r.index for r in closing] == [r.index for r in want["a"]]
    assert [r.index for r in got_b] == [r.index for r in want["b"]]
    for x, y in zip(want["b"], got_b):
        np.testing.assert_allclose(y.pose_enc, x.pose_enc, rtol=1e-5, atol=1e-5)


def test_batch_attention_side_streams_are_cuda_only(tiny):
    from engine.kv.batch_attention import BatchKV, side_streams_for
    assert side_streams_for("cpu", 4, {}) is None
    with pytest.raises(ValueError, match="side streams"):
        BatchKV([object(), object()], side_streams=[object()])
    sched = StreamScheduler(tiny, attention_streams=True)      # CPU: the plain per-stream loop
    assert sched.stats()["attention_streams"]


# every per-step phase at once: scale phase of 3, window eviction (window 2, special cap 5 < the
# keyframes cached), keyframe interval 2 (non-keyframes roll back inside a batch), KV compression
# and int8 KV; batched with a plain stream and a block-sparse one
ALL_PHASES = {
    "merge8": (dict(scale_frames=3, window=2, special_cap=5, keyframe_interval=2, kv_compression="token_merge",
                    kv_keep_ratio=0.5, kv_block_size=8, kv_dtype="int8"), dict(seed=30, n=16)),
    "subset": (dict(window=2, special_cap=4, keyframe_interval=2, kv_compression="random_subset",
                    kv_keep_ratio=0.5, kv_seed=3), dict(seed=31, n=14)),
    "sparse": (dict(scale_frames=3, window=2, kv_compression="block_sparse", kv_keep_ratio=0.5,
                    kv_block_size=4), dict(seed=32, n=13)),
    "plain": (dict(), dict(seed=33, n=12)),
}


@pytest.mark.parametrize("pipeline", [False, True])
def test_every_step_phase_batched_equals_the_session_alone(tiny, pipeline):
    frames = {k: _frames(**fr) for k, (_, fr) in ALL_PHASES.items()}
    ref = {k: _alone(tiny, over, frames[k]) for k, (over, _) in ALL_PHASES.items()}
    sched = StreamScheduler(tiny, max_batch=8, pipeline=pipeline)
    streams = {k: sched.open_stream(_cfg(**over), name=k) for k, (over, _) in ALL_PHASES.items()}
    got = {k: [] for k in ALL_PHASES}
    for i in range(max(len(f) for f in frames.values())):
        for k, st in streams.items():
            if i < len(frames[k]):
                sched.submit(st, frames[k][i])
        for st, res in sched.step():
            got[st.name].extend(res)
    kv_stats = {k: st.session.kv.stats() for k, st in streams.items()}
    for k, st in streams.items():
        got[k].extend(sched.close_stream(st))
    assert sched.stats()["largest_batch"] == 4
    m8 = kv_stats["merge8"]
    assert m8["dtype"] == "int8" and m8["compression"] == "token_merge"
    assert m8["evictions"] > 0 and m8["special_dropped"] > 0      # window and special stream evict
    for k in ALL_PHASES:
        a, b = ref[k], got[k]
        assert [r.index for r in b] == list(range(len(frames[k]))) == [r.index for r in a]
        assert [r.is_keyframe for r in a] == [r.is_keyframe for r in b]
        for x, y in zip(a, b):       # the same phases on the same inputs: equal up to batching
            np.testing.assert_allclose(y.pose_enc, x.pose_enc, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(y.depth, x.depth, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(y.conf, x.conf, rtol=1e-5, atol=1e-6)
            assert y.timestamp == x.timestamp


def test_a_failed_batched_forward_leaves_every_stream_as_before(tiny, monkeypatch):
    from tests.engine.test_streaming import _assert_same, _snapshot
    sched, st = _streaming_scheduler(tiny, "ab")
    f = _frames(40, 3)
    for s in st.values():
        sched.submit(s, f[0])
    sched.step()                                     # one batched round: both caches hold a frame
    before = {k: _snapshot(s.session) for k, s in st.items()}

    def boom(*a, **kw):
        raise RuntimeError("device lost")
    with monkeypatch.context() as m:
        m.setattr(tiny, "forward_step", boom)
        for s in st.values():
            sched.submit(s, f[1])
        with pytest.raises(RuntimeError, match="device lost"):
            sched.step()
    for k, s in st.items():                          # both steps aborted: caches and time as before
        _assert_same(_snapshot(s.session), before[k])
    for s in st.values():                            # and the streams go on
        sched.submit(s, f[2])
    served = sched.step()
    assert sorted(s.name for s, r in served if len(r) == 1) == ["a", "b"]
