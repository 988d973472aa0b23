"""Helpers of the geometric-engine tests: a shared sequence's frames as RGB, artificial scale drift
(after every keyframe the map is rescaled by `factor` about the current camera, so loop closure has
drift to correct) and a replay of a sequence's frames in a given order through one session."""
import numpy as np

from engine.api import SessionConfig, open_session


def rgb_sequence(name: str, n=None):
    """(the sequence of ../shared/data/`name`, its first `n` frames (all by default) as RGB arrays)."""
    import cv2

    from engine.evaluate import load_sequence
    from tests.conftest import DATA
    seq = load_sequence(DATA / name)
    return seq, [cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in seq.frames[:n]]


def replay(seq, frames, order, extra=None, **settings):
    """Push `frames[i]` for i in `order` (timestamps at 30 frames/s) through one geometric session
    with the sequence's intrinsics and `settings`; returns (results, events, stats(), memory())
    read after the flush, then closes the session."""
    s = open_session(SessionConfig(engine="geometric", intrinsics=seq.intrinsics.as_tuple(),
                                   extra=dict(extra or {}), **settings))
    res, ev = [], []
    for k, i in enumerate(order):
        res += s.push(frames[i], k / 30.0)
        ev += s.poll_events()
    res += s.flush()
    ev += s.poll_events()
    st, mem = s.stats(), s.memory()
    s.close()
    return res, ev, st, mem


def inject_scale_drift(monkeypatch, factor: float = 1.01) -> None:
    """Patch GeometricSession._apply (through `monkeypatch`, undone after the test)."""
    import engine.geometric.session as GS
    from engine.geometric.geometry import camera_center
    orig = GS.GeometricSession._apply

    def drifting_apply(self, step, gray):
        orig(self, step, gray)
        if step.keyframe and self.tracker.initialised:
            kf = self.tracker.keyframes[-1]
            c = camera_center(kf.R, kf.t)
            S = np.eye(4)
            S[:3, :3] *= factor
            S[:3, 3] = c - factor * c
            self.tracker.transform_world(S)

    monkeypatch.setattr(GS.GeometricSession, "_apply", drifting_apply)
