"""The run driver's reader thread (engine.run_driver.Prefetch): file frames decoded and
preprocessed ahead, in order, bounded, seekable, errors at their frame; the driver's phase timing."""
import threading
import time

import numpy as np
import pytest

from engine import SessionConfig, open_session
from engine.api import EngineError, FrameResult
from engine.model_zoo import build_model
from engine.models.recipe import fill_recipe
from engine.preprocess import Prepared, PreprocessError, preprocess
from engine.run_driver import CollectSink, Prefetch, RunDriver, SequenceSource


class CountingSource(SequenceSource):
    """A SequenceSource that records which thread read each frame and fails at `fail_at`."""

    def __init__(self, n, fail_at=None):
        super().__init__([np.full((28, 42, 3), i, np.uint8) for i in range(n)])
        self.fail_at = fail_at
        self.reads = []                     # (position, thread name)

    def read(self):
        if self._pos == self.fail_at:
            raise EngineError(f"unreadable frame {self._pos}")
        self.reads.append((self._pos, threading.current_thread().name))
        return super().read()


class PreparingSession:
    """Records what push receives and on which thread prepare_frame ran; push can be slow."""

    def __init__(self, push_s=0.0):
        self.config = SessionConfig(image_width=42)
        self.push_s = push_s
        self.prepared_on = []
        self.got = []
        self.read_ahead = []                # frames read beyond the one pushed, at each push
        self.source = None
        self.raw_pushes = 0

    def prepare_frame(self, frame):
        self.prepared_on.append(threading.current_thread().name)
        return preprocess(frame, 42)

    def push(self, frame, timestamp=None):
        if self.push_s:
            time.sleep(self.push_s)
        if not isinstance(frame, Prepared):        # as a real session: preprocess in push
            frame = preprocess(frame, 42)
            self.raw_pushes += 1
        n = int(frame.image[0, 0, 0])
        self.got.append(n)
        if self.source is not None:
            self.read_ahead.append(len(self.source.reads) - len(self.got))
        return [FrameResult(index=n, timestamp=timestamp or 0.0, is_keyframe=True, c2w=np.eye(4), K=np.eye(3),
                            image=frame.image)]

    def flush(self):
        return []

    def poll_events(self):
        return []

    def stats(self):
        return {}

    def close(self):
        pass


def test_frames_are_read_and_prepared_ahead_on_the_reader_thread_in_order_and_bounded():
    src, sess = CountingSource(30), PreparingSession(push_s=0.005)
    sess.source = src
    summary = RunDriver(src, sess, [CollectSink()], prefetch=3).run()
    assert summary.results == 30 and sess.got == list(range(30)) and sess.raw_pushes == 0
    me = threading.current_thread().name
    assert {t for _, t in src.reads} == {"prefetch"} and set(sess.prepared_on) == {"prefetch"} != {me}
    # at most the queue (3) plus the frame the reader holds waiting for a slot were read ahead
    assert max(sess.read_ahead) <= 4 and max(sess.read_ahead) >= 1


def test_prefetch_zero_reads_on_the_driver_thread():
    src, sess = CountingSource(5), PreparingSession()
    RunDriver(src, sess, [CollectSink()], prefetch=0).run()
    assert {t for _, t in src.reads} == {threading.current_thread().name}
    assert sess.prepared_on == [] and sess.raw_pushes == 5 and sess.got == list(range(5))


def test_read_error_ends_the_run_at_its_frame():
    src, sess = CountingSource(20, fail_at=7), PreparingSession()
    with pytest.raises(EngineError, match="unreadable frame 7"):
        RunDriver(src, sess, [CollectSink()], prefetch=3).run()
    assert sess.got == list(range(7))


def test_seek_discards_frames_read_ahead():
    src, sess = CountingSource(40), PreparingSession(push_s=0.002)
    sink = CollectSink()
    driver = RunDriver(src, sess, [sink], prefetch=4)

    class SeekOnce:
        def on_start(self, d): ...
        def on_results(self, results):
            if results[0].index == 5:
                driver.seek(30)
        def on_event(self, e): ...
        def on_message(self, m): ...
        def on_stats(self, s): ...
        def on_idle(self): ...
        def on_finish(self, s): ...

    driver.sinks.append(SeekOnce())
    driver.run()
    assert sess.got == list(range(6)) + list(range(30, 40))
    assert "Jumped to frame 30" in sink.messages


def test_prefetch_take_after_end_and_close():
    src = CountingSource(2)
    p = Prefetch(src, depth=1)
    assert p.take().index == 0 and p.take().index == 1
    assert p.take() is None and p.take() is None
    p.close()


def test_phase_timing_reports_where_the_driver_thread_spends_its_time():
    sess = PreparingSession(push_s=0.02)
    stats = []
    from engine.run_driver import CallbackSink
    driver = RunDriver(CountingSource(12), sess, [CallbackSink(stats=stats.append)], stats_hz=1000, prefetch=2)
    driver.run()
    last = driver.run_stats()
    assert last["push_ms"] >= 19.0              # the session's own sleep is push time
    assert 0.0 <= last["read_ms"] < last["push_ms"] and last["sinks_ms"] >= 0.0
    assert any(s.get("push_ms") for s in stats)


def test_prepared_frame_for_another_width_is_refused():
    p = preprocess(np.zeros((28, 42, 3), np.uint8), 42)
    assert preprocess(p, 42) is p
    with pytest.raises(PreprocessError, match="prepared at width 42 .* runs at width 518"):
        preprocess(p, 518)


def test_lingbot_results_equal_with_and_without_prefetch():
    model = fill_recipe(build_model("lingbot-map-tiny"))
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 256, (60, 80, 3), dtype=np.uint8) for _ in range(7)]
    cfg = SessionConfig(engine="lingbot-map", image_width=70, scale_frames=2, window=3, special_cap=8,
                        camera_iterations=2)
    out = []
    for depth in (0, 3):
        s = open_session(cfg, model=model)
        sink = CollectSink()
        RunDriver(SequenceSource(frames), s, [sink], prefetch=depth).run()
        s.close()
        out.append(sink.results)
    assert [r.index for r in out[0]] == [r.index for r in out[1]] == list(range(7))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a.pose_enc, b.pose_enc)
        np.testing.assert_array_equal(a.depth, b.depth)
        np.testing.assert_array_equal(a.image, b.image)


class LiveCam:
    """A live source of numbered 28x42 frames at `fps` (frame i has pixel value i); from frame
    `bad` on they are 2-channel (the session's preprocessing rejects them: whichever the engine
    takes first fails, however many were replaced)."""

    kind = "webcam"
    name = "test cam"
    seekable = False

    def __init__(self, n, fps=200, bad=None):
        self.n, self.dt, self.i, self.bad = n, 1.0 / fps, 0, bad
        self.warnings = []

    def read(self):
        if self.i >= self.n:
            return None
        time.sleep(self.dt)
        shape = (28, 42, 2) if self.bad is not None and self.i >= self.bad else (28, 42, 3)
        f = type("F", (), {})()
        f.index, f.timestamp, f.image = self.i, self.i * self.dt, np.full(shape, self.i, np.uint8)
        self.i += 1
        return f


def test_live_frames_are_prepared_on_the_grabber_thread():
    sess = PreparingSession(push_s=0.01)
    summary = RunDriver(LiveCam(40), sess, [CollectSink()]).run()
    assert summary.frames_in > 0 and sess.raw_pushes == 0
    assert set(sess.prepared_on) == {"live-source"} and len(sess.prepared_on) >= summary.frames_in
    assert sess.got == sorted(sess.got)


def test_a_live_frame_the_session_rejects_ends_the_run_with_its_error():
    sess = PreparingSession()
    with pytest.raises(PreprocessError, match="colour channels"):
        RunDriver(LiveCam(40, fps=50, bad=5), sess, [CollectSink()]).run()
    assert all(n < 5 for n in sess.got)
