"""`CappedRing`: the bookkeeping of "pinned entries, then a ring of the newest", shared by the KV
cache's special stream (engine/kv/page_table.py) and the camera head's cache
(engine/models/camera_head.py). Plain integers; it lives here, below both, so the cache package
depends on the model package and never the other way round."""
from __future__ import annotations

from ..api import EngineError


class CappedRing:
    """Entry bookkeeping of "pinned entries, then a ring of the newest": new entries are appended
    right after the visible ones; at commit an entry stays where it is while the ring fills, and
    afterwards overwrites the oldest ring entry (`commit` returns those (src, dst) moves).
    `pinned_in_cap`: the cap counts the pinned entries too (special stream) or not (camera cache)."""

    def __init__(self, cap: int, pinned_in_cap: bool):
        self.cap, self.pinned_in_cap = int(cap), bool(pinned_in_cap)
        self.reset()

    def reset(self) -> None:
        self.pinned = 0          # scale entries (never dropped)
        self.count = 0           # ring entries committed
        self.next = 0            # oldest ring entry (overwritten next once full)
        self.dropped = 0

    @property
    def visible(self) -> int:
        return self.pinned + self.count

    @property
    def ring_size(self) -> int:
        return self.cap - self.pinned if self.pinned_in_cap else self.cap

    def pin(self, n: int) -> None:
        if self.count:
            raise EngineError("pinned (scale) entries must come before ring entries")
        self.pinned += int(n)

    def commit(self, n: int) -> list:
        """Commit `n` entries appended at positions visible .. visible + n - 1."""
        moves = []
        start = self.visible
        for i in range(int(n)):
            if self.count < self.ring_size:
                self.count += 1
            else:
                moves.append((start + i, self.pinned + self.next))
                self.next = (self.next + 1) % self.ring_size
                self.dropped += 1
        return moves

    def state(self) -> tuple:
        return (self.pinned, self.count, self.next, self.dropped)
