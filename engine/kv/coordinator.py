"""`StreamCaches`: the one place that steps the streaming engine's two caches together.

A streamed step touches the global-attention KV cache (engine/kv/paged_cache.py) and the camera
head's cache (engine/models/camera_head.py `CameraCache`); both follow the same protocol
(`begin_step(n, scale, keyframe)`, `end_step()`, `abort_step()`) and the same keyframe rule: a
keyframe commits, a non-keyframe or a failed step leaves both exactly as before. Doing it here
means a session cannot begin one and forget the other, and a failure while beginning the second
undoes the first.
"""
from __future__ import annotations


class StreamCaches:
    def __init__(self, kv, camera):
        self.kv, self.camera = kv, camera

    def begin_step(self, num_frames: int, scale: bool, keyframe: bool) -> None:
        self.kv.begin_step(num_frames, scale=scale, keyframe=keyframe)
        try:
            self.camera.begin_step(num_frames, scale=scale, keyframe=keyframe)
        except BaseException:
            self.kv.abort_step()
            raise

    def end_step(self) -> None:
        self.kv.end_step()
        self.camera.end_step()

    def abort_step(self) -> None:
        self.kv.abort_step()
        self.camera.abort_step()

    def state(self) -> dict:
        """Both caches' tables and counters (exact-rollback checks)."""
        return {"kv": self.kv.state(), "camera": self.camera.state()}

    def stats(self) -> dict:
        return {"kv": self.kv.stats(), "camera_cache": self.camera.stats()}
