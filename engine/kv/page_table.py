"""Page tables of the paged KV cache: plain integers only (no tensors, no device).

`PageTable` owns the free list, the three streams (scale, window, special), the step protocol
(`begin_step` -> `StepTable`, `end_step` -> `CommitPlan`, `abort_step`) and the exact rollback of
a non-keyframe. It decides *which* slots hold what; `engine/kv/pool.py` moves the bytes, and the
attention backends read the `StepTable` built here once per step. `CappedRing` is the "pinned
entries + a ring of the newest" policy shared by the special stream and the camera-head cache.
The layout and semantics are documented in engine/kv/paged_cache.py.

Compressed window (`keep_tokens` < page_size): every streamed frame is processed on a page of
its own (the first `max_step_frames` pages); a committed keyframe keeps `keep_tokens` of its
patch tokens in a frame slot of the compact window region (`CommitPlan.compress` says which page
goes to which slots; the compressor picks the tokens). Visible sets are then token lists
(`StepTable.slots`), not page runs. The window's frame slots are kept packed at the start of the
compact region: when a keyframe evicts a slot that is not the last one in use, the last one's
tokens move into it (`StepTable.slot_moves`, copied by the cache before anything attends; key
order does not matter to the attention). So once the scale frames are in, a streamed step's
visible set is two runs of flat slots -- the step pages, scale pages and the used compact slots
from slot 0, then the special tokens -- whose lengths are constant once the window is full
(`StepTable.token_runs`: what the cuDNN split attends with fixed shapes).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..api import EngineError
from ..models.capped_ring import CappedRing  # noqa: F401  (the special stream's policy)

# page_map() codes (docs/interfaces.md)
PAGE_FREE, PAGE_SCALE, PAGE_WINDOW, PAGE_SPECIAL, PAGE_PENDING = 0, 1, 2, 3, 4


class KVCacheError(EngineError):
    """Bad KV-cache settings or misuse of the step protocol; the message says what to change."""


def page_slots(pages, page_size: int, count: Optional[int] = None) -> np.ndarray:
    """The flat slots (page * page_size + offset) of the tokens of `pages`, in page order; the
    first `count` of them when given (a last page partly used)."""
    out = (np.asarray(pages, np.int64)[:, None] * page_size + np.arange(page_size)).ravel()
    return out if count is None else out[:count]


@dataclass
class StepTable:
    """Everything a backend needs for one step; built once in `begin_step`, shared by all layers.
    Integers and numpy only; a pool attaches the device index tensors (`*_t`)."""

    num_frames: int
    scale: bool
    keyframe: bool
    q_tokens: int                       # F * (special_tokens + patch_tokens)
    new_pages: list                     # patch pages of the new frame(s), in frame order
    evicted: list                       # window entries a keyframe evicted at begin_step
    masked: int                         # window frames hidden from this step
    pending_special_pages: list         # special pages allocated for this step
    special_start: int                  # committed special tokens before the step
    pages: list                         # visible pages: scale -> window -> new -> special
    last_page_len: int                  # valid tokens of pages[-1]
    num_kv_tokens: int                  # visible tokens
    contiguous: Optional[tuple]         # (first_page, num_pages) when pages form one run with
                                        # the partial page last, else None
    fixed_length: bool = False          # window and special ring full: every later step of this
                                        # kind sees exactly num_kv_tokens keys (one shape for good)
    special_flat: Any = None            # np.int64 [F*special_tokens] flat slots of the new specials
    slots: Any = None                   # np.int64 visible flat slots when the window is compressed
    device: Any = None
    new_pages_t: Any = None             # int64 [F] on device
    special_flat_t: Any = None          # int64 [F*special_tokens] on device
    pages_t: Any = None                 # int64 [len(pages)] on device (gather)
    slots_t: Any = None                 # int64 [num_kv_tokens] on device (compressed window)
    int8_slots_t: Any = None            # int8 store, pages: the visible flat slots (token scales)
    window_range: Any = None            # block_sparse: (first, end) of the window in the visible set
    window_pages_t: Any = None          # block_sparse: the window's pages on device, oldest first
    token_runs: Optional[tuple] = None  # compressed window: ((a start, a len), (b start, b len)) flat
                                        # slots: [a, a + a len) = step, scale and window tokens,
                                        # [b, b + b len) = the special tokens (module docstring)
    sparse_runs: Optional[tuple] = None  # block_sparse, window full: ((a start, a len), (b start, b len))
                                        # flat slots of the scale pages and of the special tokens
                                        # (`PageTable.scale_special_runs`); the window's blocks and
                                        # the step's own page are chosen / gathered per layer
    slot_moves: Optional[tuple] = None  # compressed window: (src, dst) flat slots to copy before the
                                        # step attends (packing the window slots after an eviction)
    written: list = field(default_factory=list)   # per layer: write() done this step
    plan: Any = None                    # backend-private per-step data (e.g. FlashInfer plan)
    borrowed: list = field(default_factory=list)  # kept for backends/tests (always empty now)
    backup: list = field(default_factory=list)


@dataclass
class CommitPlan:
    """Byte moves `end_step` asks the pool for (all layers): special-ring token moves, and for a
    compressed window the (page, slot range) of every committed frame."""

    special_src: list = field(default_factory=list)     # flat slots
    special_dst: list = field(default_factory=list)
    compress: list = field(default_factory=list)        # (src_page, first_dst_flat_slot)


class PageTable:
    """Integer bookkeeping of the paged KV cache (see the module docstring)."""

    def __init__(self, page_size: int, special_tokens: int, scale_frames: int, window: int,
                 special_cap: int, max_step_frames: int = 1, keep_tokens: Optional[int] = None,
                 keyframes_only: bool = False):
        self.page_size, self.special_tokens = int(page_size), int(special_tokens)
        self.scale_frames, self.window = int(scale_frames), int(window)
        self.special_cap, self.max_step_frames = int(special_cap), int(max_step_frames)
        P = self.page_size
        self.keep_tokens = P if keep_tokens is None else int(keep_tokens)
        if not 1 <= self.keep_tokens <= P:
            raise KVCacheError(f"KV cache: keep_tokens must be in 1..{P} (got {keep_tokens})")
        self.compact = self.keep_tokens < P
        # keyframes_only (VGGT's chunks): no step ever rolls back, so no pages are set aside for
        # non-keyframes; keyframe pages start at page 0
        self.keyframes_only = bool(keyframes_only)
        if self.keyframes_only and self.compact:
            raise KVCacheError("KV cache: a compressed window processes every frame on a step page; "
                               "it cannot be keyframes_only")
        self._step_pages = 0 if self.keyframes_only else self.max_step_frames
        M = self.max_step_frames
        if self.compact:
            # [0, M) step pages, [M, M+scale) scale pages, then the compact window region
            self._compact_first = M + self.scale_frames
            self._compact_pages = math.ceil(self.window * self.keep_tokens / P)
            self._patch_zone = self._compact_first + self._compact_pages
        else:
            self._patch_zone = self.scale_frames + self.window + self._step_pages
        cap_tokens = self.special_tokens * (self.special_cap + M)
        self._special_zone_pages = math.ceil(cap_tokens / P) if self.special_tokens else 0
        self.num_pages = self._patch_zone + self._special_zone_pages
        self._ring = CappedRing(self.special_cap, pinned_in_cap=True)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        if self.compact:
            compact = set(range(self._compact_first, self._patch_zone))
            self._free = [p for p in range(self.num_pages) if p not in compact]
            self._free_slots = list(range(self.window))      # compact frame slots
        else:
            self._free = list(range(self.num_pages))          # sorted ascending
            self._free_slots = []
        self._scale: list[int] = []
        self._window: list[int] = []         # pages (or compact frame slots), oldest first
        self._special_pages: list[int] = []
        self._special_len = 0                # committed special tokens
        self._ring.reset()
        self._frames_committed = 0
        self._evictions = 0
        self._step: Optional[StepTable] = None

    def _alloc(self, lowest: int = 0) -> int:
        """Lowest free page >= `lowest` (else the lowest free page)."""
        if not self._free:
            raise KVCacheError("KV cache: out of pages (internal accounting error)")
        i = bisect.bisect_left(self._free, lowest)
        if i == len(self._free):
            i = 0
        return self._free.pop(i)

    def _release(self, page: int) -> None:
        bisect.insort(self._free, page)

    def slot_tokens(self, slot: int) -> np.ndarray:
        """Flat pool slots of compact window frame slot `slot`."""
        base = self._compact_first * self.page_size + slot * self.keep_tokens
        return np.arange(base, base + self.keep_tokens, dtype=np.int64)

    # ------------------------------------------------------------------ step protocol
    def begin_step(self, num_frames: int, scale: bool = False, keyframe: bool = True) -> StepTable:
        if self._step is not None:
            raise KVCacheError("KV cache: begin_step called twice without end_step")
        F = int(num_frames)
        if F < 1:
            raise KVCacheError(f"KV cache: num_frames must be >= 1 (got {num_frames})")
        if scale:
            if not keyframe:
                raise KVCacheError("KV cache: scale frames are always cached (keyframe=False given)")
            if self._window:
                raise KVCacheError("KV cache: scale frames must come before streamed frames")
            if len(self._scale) + F > self.scale_frames:
                raise KVCacheError(f"KV cache: {len(self._scale) + F} scale frames exceed "
                                   f"scale_frames={self.scale_frames}")
        elif F > self.max_step_frames:
            raise KVCacheError(f"KV cache: {F} frames in one streamed step exceed "
                               f"max_step_frames={self.max_step_frames}")
        if not keyframe and self.keyframes_only:
            raise KVCacheError("KV cache: this cache is keyframes_only (no pages for non-keyframe steps)")

        P, S = self.page_size, self.special_tokens
        # Only a keyframe evicts; a non-keyframe sees the full window plus itself (upstream)
        masked = 0 if (scale or not keyframe) else max(0, len(self._window) + F - self.window)
        evicted: list[int] = []
        if masked:
            # A keyframe's eviction is final: free the oldest first so the new frame reuses it
            # (keeps the steady-state visible set one contiguous run).
            evicted, self._window = self._window[:masked], self._window[masked:]
            for p in evicted:
                if self.compact:
                    bisect.insort(self._free_slots, p)
                else:
                    self._release(p)
            self._evictions += len(evicted)
        slot_moves = self._pack_slots() if (masked and self.compact) else None
        if scale:
            lowest = self._step_pages
        else:       # see "Placement"; a compressed stream processes every frame on a step page
            lowest = self._step_pages if keyframe and not self.compact else 0
        new_pages = [self._alloc(lowest) for _ in range(F)]

        # special slots for the new frames: appended at the end of the committed stream
        start = self._special_len
        end = start + S * F
        pending: list[int] = []
        while len(self._special_pages) * P < end:
            p = self._alloc(self._patch_zone)
            self._special_pages.append(p)
            pending.append(p)
        tok = np.arange(start, end, dtype=np.int64)
        sp = np.asarray(self._special_pages, dtype=np.int64)
        special_flat = sp[tok // P] * P + tok % P if S else tok

        n_sp = math.ceil(end / P) if S else 0
        window_pages = [] if self.compact else list(self._window)
        pages = self._scale + window_pages + new_pages + self._special_pages[:n_sp]
        last_len = end - (n_sp - 1) * P if n_sp else P
        slots = None
        if self.compact:
            parts = [page_slots(self._scale, P)]
            parts += [self.slot_tokens(s) for s in self._window]
            parts.append(page_slots(new_pages, P))
            t = np.arange(end, dtype=np.int64)
            parts.append(sp[t // P] * P + t % P if S and end else np.zeros(0, np.int64))
            slots = np.concatenate(parts)
            num_tokens = len(slots)
            contiguous = None
            # only once the window is full: while it fills, A grows a frame a step (a new
            # attention shape each; the split keeps a few shapes only, for the steady state)
            full = len(self._window) + (F if keyframe else 0) >= self.window
            token_runs = self._token_runs(new_pages, end) if (full and not scale) else None
        else:
            token_runs = None
            num_tokens = (len(pages) - 1) * P + last_len
            lo, hi = min(pages), max(pages)
            contiguous = None
            if hi - lo + 1 == len(pages) and (last_len == P or pages[-1] == hi):
                contiguous = (lo, len(pages))
        step = StepTable(
            num_frames=F, scale=bool(scale), keyframe=bool(keyframe), q_tokens=F * (S + P),
            new_pages=new_pages, evicted=evicted, masked=masked, pending_special_pages=pending,
            special_start=start, pages=pages, last_page_len=last_len, num_kv_tokens=num_tokens,
            contiguous=contiguous, special_flat=special_flat, slots=slots, token_runs=token_runs,
            slot_moves=slot_moves,
            fixed_length=bool(S) and not scale and self._ring.count >= self._ring.ring_size
            and len(self._window) + (F if keyframe else 0) >= self.window)
        self._step = step
        return step

    def _pack_slots(self) -> Optional[tuple]:
        """Compressed window, after an eviction: move the window frames held in the highest slots
        into the freed lower ones, so the used slots are 0 .. n-1 again; the (src, dst) flat
        slots to copy (None: nothing moved). A move is final, like the eviction."""
        n = len(self._window)
        high = sorted((s for s in self._window if s >= n), reverse=True)
        if not high:
            return None
        holes = [s for s in self._free_slots if s < n][:len(high)]
        src, dst = [], []
        where = {s: i for i, s in enumerate(self._window)}
        for s, h in zip(high, holes):
            self._window[where[s]] = h
            src.append(self.slot_tokens(s))
            dst.append(self.slot_tokens(h))
        self._free_slots = list(range(n, self.window))
        return np.concatenate(src), np.concatenate(dst)

    def _token_runs(self, new_pages: list, special_end: int) -> Optional[tuple]:
        """The visible set of a compressed streamed step as two runs of flat slots (StepTable
        `token_runs`), or None when it is not laid out so (the scale frames not all in, a step of
        fewer frames than the step pages). Called once the window is full."""
        P, M, K = self.page_size, self.max_step_frames, self.keep_tokens
        n_sp = math.ceil(special_end / P) if self.special_tokens else 0
        if (sorted(new_pages) != list(range(M)) or sorted(self._scale) != list(range(M, self._compact_first))
                or sorted(self._window) != list(range(len(self._window)))
                or self._special_pages[:n_sp] != list(range(self._patch_zone, self._patch_zone + n_sp))):
            return None
        return (0, self._compact_first * P + len(self._window) * K), (self._patch_zone * P, special_end)

    def scale_special_runs(self, step: StepTable) -> Optional[tuple]:
        """For a streamed step of an uncompressed window that is full: ((a start, a len), (b start,
        b len)) flat slots of the scale pages (one run) and of the visible special tokens (one run
        from the special zone's start) -- what stays fixed from step to step when each layer
        attends only some window blocks (block_sparse, StepTable `sparse_runs`); None when the
        step is not laid out so (the window filling or empty, the scale frames not all in)."""
        P, S = self.page_size, self.special_tokens
        if step.scale or self.compact or not S or not self._window:
            return None
        if len(self._window) + (step.num_frames if step.keyframe else 0) < self.window:
            return None
        first = min(self._scale) if self._scale else 0
        end = step.special_start + S * step.num_frames
        n_sp = math.ceil(end / P)
        if (len(self._scale) != self.scale_frames or not self._scale
                or sorted(self._scale) != list(range(first, first + len(self._scale)))
                or self._special_pages[:n_sp] != list(range(self._patch_zone, self._patch_zone + n_sp))):
            return None
        return (first * P, len(self._scale) * P), (self._patch_zone * P, end)

    def end_step(self) -> CommitPlan:
        """Keyframe: commit and return the byte moves for the pool. Non-keyframe: restore every
        table, counter and the free list exactly as before `begin_step` (nothing to move)."""
        step = self._require_step()
        self._step = None
        plan = CommitPlan()
        if not step.keyframe:
            self._rollback(step)
            return plan
        S, P = self.special_tokens, self.page_size
        if step.scale:
            self._scale.extend(step.new_pages)
            self._ring.pin(step.num_frames)
        elif self.compact:
            for p in step.new_pages:            # full tokens -> kept tokens in a frame slot
                slot = self._free_slots.pop(0)
                plan.compress.append((p, int(self.slot_tokens(slot)[0])))
                self._window.append(slot)
                self._release(p)                # the pool copies before the page is reused
        else:
            self._window.extend(step.new_pages)
        self._frames_committed += step.num_frames
        self._special_len = step.special_start + S * step.num_frames
        if S and not step.scale:
            moves = self._ring.commit(step.num_frames)
            if moves:
                sp = np.asarray(self._special_pages, dtype=np.int64)
                for src_f, dst_f in moves:
                    for t_src, t_dst in zip(range(src_f * S, src_f * S + S), range(dst_f * S, dst_f * S + S)):
                        plan.special_src.append(int(sp[t_src // P] * P + t_src % P))
                        plan.special_dst.append(int(sp[t_dst // P] * P + t_dst % P))
                self._special_len = S * self._ring.visible
                keep = math.ceil(self._special_len / P)
                for p in self._special_pages[keep:]:
                    self._release(p)
                del self._special_pages[keep:]
        return plan

    def abort_step(self) -> None:
        """Undo a step that failed half-way. Tables return to their state before `begin_step`,
        except that window frames a keyframe already evicted stay evicted."""
        if self._step is not None:
            step, self._step = self._step, None
            self._rollback(step)

    def _rollback(self, step: StepTable) -> None:
        for p in step.new_pages:
            self._release(p)
        for p in step.pending_special_pages:
            self._special_pages.remove(p)
            self._release(p)

    def _require_step(self) -> StepTable:
        if self._step is None:
            raise KVCacheError("KV cache: no step in progress (call begin_step first)")
        return self._step

    # ------------------------------------------------------------------ inspection
    @property
    def step(self) -> Optional[StepTable]:
        return self._step

    def state(self) -> dict:
        """Every table and counter (for exact-rollback checks and debugging)."""
        return {
            "free": tuple(self._free), "free_slots": tuple(self._free_slots), "scale": tuple(self._scale),
            "window": tuple(self._window), "special_pages": tuple(self._special_pages),
            "special_len": self._special_len, "ring_next": self._ring.next,
            "frames_committed": self._frames_committed, "evictions": self._evictions,
            "special_dropped": self._ring.dropped,
        }

    def committed_slots(self) -> np.ndarray:
        """Flat pool slots holding committed data (scale and window tokens, committed specials)."""
        P = self.page_size
        full = np.asarray(self._scale + ([] if self.compact else self._window), dtype=np.int64)
        parts = [(full[:, None] * P + np.arange(P)[None, :]).ravel()]
        if self.compact:
            parts += [self.slot_tokens(s) for s in self._window]
        t = np.arange(self._special_len, dtype=np.int64)
        if len(t):
            sp = np.asarray(self._special_pages, dtype=np.int64)
            parts.append(sp[t // P] * P + t % P)
        return np.concatenate(parts)

    def window_page_set(self) -> list:
        """Pages holding window tokens (the compact region's pages in use when compressed)."""
        if not self.compact:
            return list(self._window)
        P = self.page_size
        used = sorted({int(t) // P for s in self._window for t in self.slot_tokens(s)[[0, -1]]})
        return list(range(used[0], used[-1] + 1)) if used else []

    def page_map(self) -> np.ndarray:
        """int8 per page: 0 free, 1 scale, 2 window, 3 special, 4 pending."""
        m = np.zeros(self.num_pages, dtype=np.int8)
        m[self._scale] = PAGE_SCALE
        m[self.window_page_set()] = PAGE_WINDOW
        m[self._special_pages] = PAGE_SPECIAL
        if self._step is not None:
            m[self._step.new_pages] = PAGE_PENDING
            m[self._step.pending_special_pages] = PAGE_PENDING
        return m

    def counts(self) -> dict:
        step = self._step
        S = self.special_tokens
        window_tokens = len(self._window) * self.keep_tokens
        return {
            "pages_total": self.num_pages,
            "pages_free": len(self._free) + (self._compact_pages - len(self.window_page_set())
                                             if self.compact else 0),
            "pages_scale": len(self._scale),
            "pages_window": len(self.window_page_set()),
            "pages_special": len(self._special_pages) - (len(step.pending_special_pages) if step else 0),
            "pages_pending": (len(step.new_pages) + len(step.pending_special_pages)) if step else 0,
            "page_size": self.page_size,
            "cached_frames": len(self._scale) + len(self._window),
            "special_frames": self._special_len // S if S else 0,
            "special_tokens": self._special_len,
            "special_cap": self.special_cap,
            "special_dropped": self._ring.dropped,
            "frames_committed": self._frames_committed,
            "evictions": self._evictions,
            "window": self.window,
            "scale_frames": self.scale_frames,
            "window_tokens_per_frame": self.keep_tokens,
            "kept_tokens": len(self._scale) * self.page_size + window_tokens + self._special_len,
        }
