"""The one run driver: backpressure, newest-frame policy for live sources, drop counting,
pause / step / seek / stop, pacing, and nothing dropped from the store."""
import threading
import time

import numpy as np
import pytest

from engine.api import EngineEvent, FrameResult, SessionConfig, open_session
from engine.io.store import SessionStore, load_session
from engine.run_driver import (CallbackSink, CollectSink, RunDriver, SequenceSource, Sink, StoreSink,
                               ThreadedSink)


class FakeSession:
    """Echoes every pushed frame as a result (index = the frame's own number), optionally slowly;
    emits an event every 5 pushes."""

    def __init__(self, push_s=0.0):
        self.push_s = push_s
        self.pushed = []          # frame numbers in push order
        self.events = []
        self.config = SessionConfig()

    def push(self, frame, timestamp=None):
        if self.push_s:
            time.sleep(self.push_s)
        n = int(frame[0, 0, 0]) if isinstance(frame, np.ndarray) else int(frame)
        self.pushed.append(n)
        if len(self.pushed) % 5 == 0:
            self.events.append(EngineEvent("info", 0, message=f"pushed {len(self.pushed)}"))
        return [FrameResult(index=len(self.pushed) - 1, timestamp=timestamp or 0.0, is_keyframe=True,
                            c2w=np.eye(4), K=np.eye(3), image=np.zeros((4, 4, 3), np.uint8))]

    def flush(self):
        return []

    def poll_events(self):
        e, self.events = self.events, []
        return e

    def stats(self):
        return {"frames": len(self.pushed)}

    def close(self):
        pass


class FakeLive:
    """A camera delivering frame numbers 0..n-1 at `fps` whether or not anyone takes them."""

    kind = "webcam"
    name = "fake cam"
    seekable = False

    def __init__(self, n, fps):
        self.n, self.dt, self.i = n, 1.0 / fps, 0
        self.warnings = []
        self.produced = []        # (frame number, wall time)

    def read(self):
        if self.i >= self.n:
            return None
        time.sleep(self.dt)
        f = type("F", (), {})()
        f.index, f.timestamp, f.image = self.i, self.i * self.dt, self.i
        self.produced.append((self.i, time.perf_counter()))
        self.i += 1
        return f


def _frames(n):
    return [np.full((2, 2, 3), i % 256, np.uint8) for i in range(n)]


def test_file_source_every_frame_in_order_with_events():
    sess, sink = FakeSession(), CollectSink()
    summary = RunDriver(SequenceSource(_frames(20)), sess, [sink]).run()
    assert sess.pushed == list(range(20))
    assert [r.index for r in sink.results] == list(range(20))
    assert [e.message for e in sink.events] == [f"pushed {k}" for k in (5, 10, 15, 20)]
    assert summary.ended and not summary.stopped and summary.dropped == 0 and not summary.cut_short


def test_slow_consumer_makes_the_engine_wait():
    consumed, lag = [], []
    sess = FakeSession()

    class Slow(Sink):
        def on_results(self, results):
            time.sleep(0.01)
            consumed.extend(results)

    def watch(results):
        lag.append(len(sess.pushed) - len(consumed))

    summary = RunDriver(SequenceSource(_frames(40)), sess, [CallbackSink(results=watch), ThreadedSink(Slow(), maxsize=2)]).run()
    assert len(consumed) == 40 == summary.results            # nothing dropped
    assert max(lag) <= 2 + 2                                   # queue + the one being consumed + the new one


def test_live_source_newest_frame_and_drop_count():
    cam = FakeLive(n=120, fps=400)
    sess = FakeSession(push_s=0.02)                            # engine 8x slower than the camera
    taken_at = []
    orig = sess.push

    def push(frame, ts=None):
        taken_at.append((int(frame), cam.i - 1))               # frame pushed vs newest produced
        return orig(np.full((1, 1, 1), int(frame) % 256), ts)

    sess.push = push
    summary = RunDriver(cam, sess, [CollectSink()]).run()
    pushed = [p for p, _ in taken_at]
    assert pushed == sorted(pushed) and len(pushed) < 60       # frames were skipped, in order
    assert summary.dropped > 40
    assert summary.frames_in + summary.dropped <= 120 <= summary.frames_in + summary.dropped + 2
    # never a backlog: the engine always got (almost) the newest frame
    assert max(newest - p for p, newest in taken_at) <= 2


def test_file_source_is_never_dropped_even_with_a_slow_engine():
    sess = FakeSession(push_s=0.005)
    summary = RunDriver(SequenceSource(_frames(30)), sess, []).run()
    assert sess.pushed == list(range(30)) and summary.dropped == 0


def test_pause_step_seek_stop():
    sess, sink = FakeSession(push_s=0.01), CollectSink()
    d = RunDriver(SequenceSource(_frames(200)), sess, [sink], start_paused=True)
    t = threading.Thread(target=d.run)
    t.start()

    def until(cond, timeout=5.0):
        end = time.time() + timeout
        while not cond() and time.time() < end:
            time.sleep(0.01)
        assert cond()

    time.sleep(0.15)
    assert sess.pushed == []                                   # paused: nothing happens
    d.step(3)
    until(lambda: len(sess.pushed) == 3)
    time.sleep(0.15)
    assert sess.pushed == [0, 1, 2]                            # stays paused after the steps
    d.seek(30)
    d.step(1)
    until(lambda: len(sess.pushed) == 4)
    assert sess.pushed[-1] == 30
    d.resume()
    until(lambda: len(sess.pushed) >= 8)
    d.stop()
    t.join(5)
    s = d.summary
    assert s.stopped and not s.ended and "stopped by the user" in s.cut_short
    assert any("Jumped to frame 30" in m for m in sink.messages)


def test_pacing_real_time_and_speed_factor():
    ts = [i / 50.0 for i in range(11)]                         # 0.2 s of input
    t0 = time.perf_counter()
    RunDriver(SequenceSource(_frames(11), ts), FakeSession(), [], speed=1.0).run()
    real = time.perf_counter() - t0
    t0 = time.perf_counter()
    RunDriver(SequenceSource(_frames(11), ts), FakeSession(), [], speed=4.0).run()
    fast = time.perf_counter() - t0
    assert real >= 0.19 and fast >= 0.045 and fast < real


def test_stop_with_reason_marks_interrupted():
    d = RunDriver(SequenceSource(_frames(10)), FakeSession(), [])
    d.stop("SIGTERM")
    s = d.run()
    assert s.interrupted == "SIGTERM" and "interrupted (SIGTERM)" in s.cut_short


def test_store_holds_every_frame_through_its_bounded_queue(tmp_path):
    """Synthetic engine at full rate, a deliberately slow store: nothing is lost."""
    sess = open_session(SessionConfig(engine="synthetic"))
    store = SessionStore(tmp_path / "s", sess.config, "test", background=True, queue_size=2)
    orig = store._store

    def slow_store(item):
        time.sleep(0.005)
        orig(item)

    store._store = slow_store
    summary = RunDriver(SequenceSource([None] * 60), sess, [StoreSink(store)]).run()
    loaded = load_session(tmp_path / "s")
    assert summary.results == 60 and [r.index for r in loaded.results] == list(range(60))
    assert loaded.complete and not loaded.problems


def test_sink_error_ends_the_run_and_store_still_closes(tmp_path):
    sess = open_session(SessionConfig(engine="synthetic"))
    store = SessionStore(tmp_path / "s", sess.config, "test", background=True)

    class Boom(Sink):
        def on_results(self, results):
            if results[0].index == 5:
                raise OSError("disk full")

    with pytest.raises(OSError):
        RunDriver(SequenceSource([None] * 20), sess, [StoreSink(store), Boom()]).run()
    loaded = load_session(tmp_path / "s")
    assert loaded.complete and len(loaded.results) == 6
