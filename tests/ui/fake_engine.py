"""A tiny deterministic engine for GUI tests that must not depend on the real engines' speed
or tracking: each pushed frame gives one result at once (a tilted plane in front of a camera that
slides along x). `config.extra` tunes it:
  delay_s      seconds each push sleeps (keeps a run alive while a test drives the transport)
  realign_at   after this input index, emit a "realign" event moving segment 0 by +1 in y
  loop_at      after this input index, emit a loop closure as frame-range "realign" events: one
               per keyframe stretch (first, first + 1) of frames before it (a similarity that
               grows with `first`), then one for frames (0, 3) that replaces the first two
  segment_every  start a new segment every N frames
  hold         return nothing for the first `hold` pushes, then all of them (a scale phase)
  keyframe_depth  depth (and confidence) on keyframes only, as the geometric engine does
Registered as "ui-test" on import."""
from __future__ import annotations

import time

import numpy as np

from engine.api import EngineEvent, FrameResult, SessionConfig, register_engine

NAME = "ui-test"
W, H = 64, 48


def loop_events(last: int) -> list:
    """The frame-range corrections `loop_at` emits after input frame `last`."""
    def sim(s, yaw, t):
        c, n = np.cos(yaw), np.sin(yaw)
        T = np.eye(4)
        T[:3, :3] = s * np.array([[c, 0, n], [0, 1, 0], [-n, 0, c]])
        T[:3, 3] = t
        return T
    out = [EngineEvent("realign", segment=0, transform=sim(1.0 + 0.02 * f, 0.05 * f, (0.0, 0.1 * f, 0.0)),
                       frames=(f, f + 1)) for f in range(0, last, 2)]
    out.append(EngineEvent("realign", segment=0, transform=sim(0.9, -0.2, (0.0, -0.5, 0.3)), frames=(0, 3)))
    return out


class FakeSession:
    def __init__(self, config: SessionConfig, model=None):
        self.config = config
        self.extra = dict(config.extra or {})
        self.n = 0
        self.events: list[EngineEvent] = []
        self.closed = False
        self.pushed = 0

    def push(self, frame, timestamp=None):
        time.sleep(float(self.extra.get("delay_s", 0.0)))
        i = self.n
        self.n += 1
        self.pushed += 1
        c2w = np.eye(4)
        c2w[0, 3] = 0.05 * i
        K = np.array([[50.0, 0, (W - 1) / 2], [0, 50.0, (H - 1) / 2], [0, 0, 1]])
        img = np.asarray(frame)
        small = img[:: max(1, img.shape[0] // H), :: max(1, img.shape[1] // W)][:H, :W].copy()
        depth = (2.0 + 0.01 * np.arange(W)[None, :] + 0 * np.arange(H)[:, None]).astype(np.float32)
        conf = np.tile(np.linspace(1.0, 5.0, W, dtype=np.float32), (H, 1))
        every = int(self.extra.get("segment_every", 0))
        seg = i // every if every else 0
        if self.extra.get("realign_at") is not None and i == int(self.extra["realign_at"]):
            T = np.eye(4)
            T[1, 3] = 1.0
            self.events.append(EngineEvent("realign", segment=0, transform=T))
        if self.extra.get("loop_at") is not None and i == int(self.extra["loop_at"]):
            self.events += loop_events(i)
        if self.extra.get("keyframe_depth") and i % 2:
            depth = conf = None
        r = FrameResult(index=i, timestamp=float(timestamp or 0.0), is_keyframe=(i % 2 == 0), c2w=c2w,
                        K=K, image=small, depth=depth, conf=conf, segment=seg)
        held = getattr(self, "_held", [])
        if i < int(self.extra.get("hold", 0)):
            self._held = held + [r]
            return []
        self._held = []
        return held + [r]

    def flush(self):
        return []

    def stats(self):
        return {"frames": self.n, "keyframes": (self.n + 1) // 2, "fps": 100.0, "latency_ms": 1.0,
                "latency_p50_ms": 1.0, "latency_p95_ms": 1.0, "gpu_allocated_bytes": None,
                "gpu_reserved_bytes": None, "segments": 1,
                "kv_page_map": np.array([1, 1, 2, 2, 2, 3, 0, 0, 0, 4], np.int8)}

    def poll_events(self):
        ev, self.events = self.events, []
        return ev

    def close(self):
        self.closed = True


CAPABILITIES = {
    "label": "UI test engine", "needs_checkpoint": False, "devices": ["cpu"], "dtypes": ["fp32"],
    "backends": ["auto"], "modes": ["streaming", "windowed"], "kv_compression": ["none"],
    "kv_dtypes": ["auto"], "fields": ["window", "mode", "scale_frames"],
    "tooltips": {"window": "test tooltip for window"},
}

register_engine(NAME, FakeSession, CAPABILITIES)
