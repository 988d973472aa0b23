"""Paged KV cache of the streaming global attention (one module, shared by every backend).

Layout
------
Per global layer the keys and values live in two page pools, allocated once for all layers:
``k_pool``/``v_pool`` of shape ``[num_layers, num_pages, page_size, heads, head_dim]``, where
``page_size`` = the patch tokens of one frame, so a page holds one frame's patches. Three streams
share the pages and one free list (page tables are the same for every layer):

* **scale** pages: the patches of the first ``scale_frames`` frames; never evicted.
* **window** pages: the patches of the newest ``window`` cached frames; evicted oldest-first.
* **special** pages: the ``special_tokens`` (6) special tokens of every cached frame, packed
  densely as one token stream, so only its last page is partial.

A step's visible page table is scale -> window -> new frame(s) -> special, so the only partial
page is the last one (the FlashInfer paged format) and one table, built once in `begin_step`,
serves every layer. Keys are stored as given (already qk-normed and RoPE'd) in the pool dtype,
which is exactly the dtype asked for (no silent downcast). Global attention has no mask and the
keys carry their positions, so the order of keys does not change the result.

Semantics (match upstream LingBot-Map, shared/fixtures/README.md section 4)
--------------------------------------------------------------------------
* Scale step (``begin_step(F, scale=True)``): the F frames attend to each other (and to earlier
  scale frames) bidirectionally; they become scale frames.
* Streamed step: with ``window = W`` a new frame sees the patches of the scale frames, of itself
  and of the W-1 newest cached non-scale frames ("append, evict, attend"), plus the special
  tokens of every cached frame (bounded by ``special_cap``, below).
* Keyframe: `end_step` commits (the oldest window frame is evicted to the free list when the
  window is over-full; its special tokens stay). Non-keyframe (upstream's FlashInfer path, its
  default; shared/DESIGN.md "Keyframe semantics"): it does NOT evict. It writes into pending
  special slots and a page of its own, attends to the full window plus itself (one frame more
  than a keyframe sees once the window is full), and `end_step` restores every table, counter
  and the free list exactly (committed pool bytes are never written).

Special cap policy
------------------
The special stream keeps at most ``special_cap`` committed frames. The scale frames' specials
are pinned at its start; the other slots form a ring. The cap is applied at commit ("append,
attend, drop"): a frame sees the specials of up to ``special_cap`` committed frames plus its own,
and when it is committed its specials overwrite the slot of the oldest non-scale frame (a copy of
6 tokens for all layers at once). ``special_cap`` must be at least ``scale_frames + window`` so
that every frame whose patches are visible also has its specials.

Placement (why the steady state needs no gather)
------------------------------------------------
The first ``max_step_frames`` pages are the non-keyframes' own pages; scale and keyframe patch
pages are taken lowest-first from ``[max_step_frames, max_step_frames + scale_frames + window)``,
special pages lowest-first from the zone right after it. A keyframe
evicts before it allocates, so it reuses the evicted page. In the steady state of a keyframe
stream the visible pages are therefore one contiguous run whose partial page is its last, and the
SDPA backend attends to a zero-copy view of the pool (one dense call, no gather); a non-keyframe
adds page 0 in front of that run, so its set (full window + itself) is one run as well.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from ..api import EngineError

# page_map() codes (docs/interfaces.md)
PAGE_FREE, PAGE_SCALE, PAGE_WINDOW, PAGE_SPECIAL, PAGE_PENDING = 0, 1, 2, 3, 4

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}


class KVCacheError(EngineError):
    """Bad KV-cache settings or misuse of the step protocol; the message says what to change."""


def parse_dtype(dtype: Any) -> torch.dtype:
    """torch dtype from a torch dtype or one of the config names ("fp32", "bf16", "fp16")."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise KVCacheError(f"unsupported KV-cache dtype {dtype}; use fp32, bf16 or fp16")
        return dtype
    key = str(dtype).lower().replace("torch.", "")
    if key not in _DTYPES:
        raise KVCacheError(f"unknown KV-cache dtype {dtype!r}; use fp32, bf16 or fp16")
    return _DTYPES[key]


@dataclass
class StepTable:
    """Everything a backend needs for one step; built once in `begin_step`, shared by all layers."""

    num_frames: int
    scale: bool
    keyframe: bool
    q_tokens: int                       # F * (special_tokens + patch_tokens)
    new_pages: list                     # patch pages of the new frame(s), in frame order
    evicted: list                       # window pages a keyframe evicted at begin_step
    masked: int                         # window frames hidden from this step
    pending_special_pages: list         # special pages allocated for this step
    special_start: int                  # committed special tokens before the step
    pages: list                         # visible pages: scale -> window -> new -> special
    last_page_len: int                  # valid tokens of pages[-1]
    num_kv_tokens: int                  # visible tokens
    contiguous: Optional[tuple]         # (first_page, num_pages) when pages form one run with
                                        # the partial page last, else None
    device: torch.device
    new_pages_t: torch.Tensor = None    # int64 [F] on device
    special_flat_t: torch.Tensor = None  # int64 [F*special_tokens] flat slot index (page*P+off)
    pages_t: torch.Tensor = None        # int64 [len(pages)] on device (gather)
    written: list = field(default_factory=list)   # per layer: write() done this step
    plan: Any = None                    # backend-private per-step data (e.g. FlashInfer plan)
    borrowed: list = field(default_factory=list)  # non-keyframe: hidden window pages written over
    backup: list = field(default_factory=list)    # spare pages holding the borrowed pages' bytes


class PagedKVCache:
    """Paged KV cache of all global-attention layers (see the module docstring)."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, patch_tokens: int,
                 special_tokens: int = 6, scale_frames: int = 8, window: int = 64,
                 special_cap: int = 1024, dtype: Any = torch.float32, device: Any = "cpu",
                 backend: str = "sdpa", max_step_frames: int = 1):
        for name, val, lo in (("num_layers", num_layers, 1), ("num_heads", num_heads, 1),
                              ("head_dim", head_dim, 1), ("patch_tokens", patch_tokens, 1),
                              ("special_tokens", special_tokens, 0), ("scale_frames", scale_frames, 1),
                              ("window", window, 1), ("special_cap", special_cap, 1),
                              ("max_step_frames", max_step_frames, 1)):
            if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < lo:
                raise KVCacheError(f"KV cache: {name} must be an integer >= {lo} (got {val!r})")
        if special_tokens and special_cap < scale_frames + window:
            raise KVCacheError(
                f"special_cap ({special_cap}) must be at least scale_frames + window "
                f"({scale_frames} + {window} = {scale_frames + window}) so every frame whose patches "
                f"are cached keeps its special tokens")
        if max_step_frames > window:
            raise KVCacheError(f"max_step_frames ({max_step_frames}) cannot exceed the window ({window})")
        self.num_layers, self.num_heads, self.head_dim = int(num_layers), int(num_heads), int(head_dim)
        self.page_size = self.patch_tokens = int(patch_tokens)
        self.special_tokens = int(special_tokens)
        self.scale_frames, self.window = int(scale_frames), int(window)
        self.special_cap, self.max_step_frames = int(special_cap), int(max_step_frames)
        self.dtype = parse_dtype(dtype)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise KVCacheError("KV cache: device 'cuda' was asked for but CUDA is not available")

        P = self.page_size
        # zones: non-keyframe pages [0, M), scale + window [M, Z), specials [Z, Z + Ns) ("Placement")
        self._patch_zone = self.scale_frames + self.window + self.max_step_frames
        cap_tokens = self.special_tokens * (self.special_cap + self.max_step_frames)
        self._special_zone_pages = math.ceil(cap_tokens / P) if self.special_tokens else 0
        self.num_pages = self._patch_zone + self._special_zone_pages
        shape = (self.num_layers, self.num_pages, P, self.num_heads, self.head_dim)
        try:
            self.k_pool = torch.empty(shape, dtype=self.dtype, device=self.device)
            self.v_pool = torch.empty(shape, dtype=self.dtype, device=self.device)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            need = 2 * math.prod(shape) * torch.empty((), dtype=self.dtype).element_size()
            raise KVCacheError(
                f"not enough memory for the KV cache ({need / 2**30:.2f} GiB on {self.device}); "
                f"lower the window, the resolution or use bf16") from exc

        from .backends import resolve_backend  # late import: backends import this module
        self.backend = resolve_backend(backend, self.device, self.dtype)
        self._attn = self.backend.create(self)
        self.timer = None       # optional `name -> context manager` around attend (benchmarks)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every cached frame (pool bytes are left as they are; nothing is reallocated)."""
        self._free = list(range(self.num_pages))        # sorted ascending
        self._scale: list[int] = []
        self._window: list[int] = []                     # oldest first
        self._special_pages: list[int] = []
        self._special_len = 0                            # committed special tokens
        self._ring_next = 0                              # next non-scale special slot to overwrite
        self._frames_committed = 0
        self._evictions = 0
        self._special_dropped = 0
        self._step: Optional[StepTable] = None
        self._last_visible_tokens = 0
        self._last_zero_copy = None

    def _alloc(self, lowest: int = 0) -> int:
        """Lowest free page >= `lowest` (else the lowest free page)."""
        i = bisect.bisect_left(self._free, lowest)
        if i == len(self._free):
            i = 0
        if not self._free:
            raise KVCacheError("KV cache: out of pages (internal accounting error)")
        return self._free.pop(i)

    def _alloc_top(self) -> int:
        if not self._free:
            raise KVCacheError("KV cache: out of pages (internal accounting error)")
        return self._free.pop()

    def _release(self, page: int) -> None:
        bisect.insort(self._free, page)

    def _copy_pages(self, src: list, dst: list) -> None:
        """Copy whole pages (every layer, keys and values) from `src` to `dst`."""
        s = torch.tensor(src, dtype=torch.int64, device=self.device)
        d = torch.tensor(dst, dtype=torch.int64, device=self.device)
        for pool in (self.k_pool, self.v_pool):
            pool.index_copy_(1, d, pool.index_select(1, s))

    # ------------------------------------------------------------------ step protocol
    def begin_step(self, num_frames: int, scale: bool = False, keyframe: bool = True) -> StepTable:
        """Reserve pages for `num_frames` new frames and build the visible table (all layers)."""
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

        P, S = self.page_size, self.special_tokens
        # Only a keyframe evicts; a non-keyframe sees the full window plus itself (upstream)
        masked = 0 if (scale or not keyframe) else max(0, len(self._window) + F - self.window)
        evicted: list[int] = []
        borrowed: list[int] = []
        backup: list[int] = []
        if masked:
            # A keyframe's eviction is final: free the oldest pages first so the new frame reuses
            # them (keeps the steady-state visible set one contiguous run).
            evicted, self._window = self._window[:masked], self._window[masked:]
            for p in evicted:
                self._release(p)
            self._evictions += len(evicted)
        visible_window = list(self._window)
        lowest = self.max_step_frames if keyframe else 0      # see "Placement"
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
        pages = self._scale + visible_window + new_pages + self._special_pages[:n_sp]
        last_len = end - (n_sp - 1) * P if n_sp else P
        num_tokens = (len(pages) - 1) * P + last_len
        lo, hi = min(pages), max(pages)
        contiguous = None
        if hi - lo + 1 == len(pages) and (last_len == P or pages[-1] == hi):
            contiguous = (lo, len(pages))

        dev = self.device
        step = StepTable(
            num_frames=F, scale=bool(scale), keyframe=bool(keyframe), q_tokens=F * (S + P),
            new_pages=new_pages, evicted=evicted, masked=masked, borrowed=borrowed, backup=backup,
            pending_special_pages=pending,
            special_start=start, pages=pages, last_page_len=last_len, num_kv_tokens=num_tokens,
            contiguous=contiguous, device=dev,
            new_pages_t=torch.tensor(new_pages, dtype=torch.int64, device=dev),
            special_flat_t=torch.as_tensor(special_flat, dtype=torch.int64).to(dev),
            pages_t=torch.tensor(pages, dtype=torch.int64, device=dev),
            written=[False] * self.num_layers,
        )
        self._step = step
        self._last_visible_tokens = num_tokens
        self._last_zero_copy = contiguous is not None
        self._attn.plan(step)
        return step

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new frames' keys/values of one layer: k, v [F, T, H, D], T = specials +
        patches in that order, already qk-normed and RoPE'd. Converted to the pool dtype."""
        step = self._require_step()
        F, T = step.num_frames, self.special_tokens + self.page_size
        want = (F, T, self.num_heads, self.head_dim)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise KVCacheError(f"KV cache write: expected k, v of shape {list(want)}, "
                               f"got {list(k.shape)} and {list(v.shape)}")
        S = self.special_tokens
        for pool, x in ((self.k_pool[layer], k), (self.v_pool[layer], v)):
            x = x.to(device=self.device, dtype=self.dtype)
            pool.index_copy_(0, step.new_pages_t, x[:, S:])
            if S:
                flat = pool.view(self.num_pages * self.page_size, self.num_heads, self.head_dim)
                flat.index_copy_(0, step.special_flat_t, x[:, :S].reshape(F * S, self.num_heads, self.head_dim))
        step.written[layer] = True

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [F, T, H, D] -> [F, T, H, D]: every query attends (no mask) to the visible set:
        scale patches, window patches, the new frames, and the cached special tokens."""
        step = self._require_step()
        F, T = step.num_frames, self.special_tokens + self.page_size
        want = (F, T, self.num_heads, self.head_dim)
        if tuple(q.shape) != want:
            raise KVCacheError(f"KV cache attend: expected q of shape {list(want)}, got {list(q.shape)}")
        if not step.written[layer]:
            raise KVCacheError(f"KV cache attend: layer {layer} was not written in this step")
        qf = q.reshape(F * T, self.num_heads, self.head_dim)
        if self.timer is None:
            out = self._attn.attend(step, qf, self.k_pool[layer], self.v_pool[layer])
        else:
            with self.timer("global_attention"):
                out = self._attn.attend(step, qf, self.k_pool[layer], self.v_pool[layer])
        return out.reshape(want)

    def end_step(self) -> None:
        """Keyframe: commit (evictions already done, special cap applied). Non-keyframe: restore
        every table, counter, the free list and any borrowed page's bytes exactly as before
        `begin_step`."""
        step = self._require_step()
        self._step = None
        if not step.keyframe:
            self._rollback(step)
            return
        if step.scale:
            self._scale.extend(step.new_pages)
        else:
            self._window.extend(step.new_pages)
        self._frames_committed += step.num_frames
        self._special_len = step.special_start + self.special_tokens * step.num_frames
        self._apply_special_cap()

    def abort_step(self) -> None:
        """Undo a step that failed half-way (e.g. an exception inside a layer). Tables return to
        their state before `begin_step`, except that window frames a keyframe already evicted stay
        evicted (their pages may have been overwritten)."""
        if self._step is not None:
            step, self._step = self._step, None
            self._rollback(step)

    def _rollback(self, step: StepTable) -> None:
        if step.borrowed:
            self._copy_pages(step.backup, step.borrowed)
            for p in step.backup:
                self._release(p)
        for p in step.new_pages:
            if p not in step.borrowed:
                self._release(p)
        for p in step.pending_special_pages:
            self._special_pages.remove(p)
            self._release(p)

    def _apply_special_cap(self) -> None:
        """Keep at most special_cap frames' specials: overflowing frames (appended at the end)
        overwrite the ring slots of the oldest non-scale frames; surplus pages go back."""
        S, P = self.special_tokens, self.page_size
        cap = S * self.special_cap
        if not S or self._special_len <= cap:
            return
        base = S * len(self._scale)                   # pinned: the scale frames' specials
        ring = (cap - base) // S
        src, dst = [], []
        for t in range(cap, self._special_len, S):
            src.extend(range(t, t + S))
            d = base + S * self._ring_next
            dst.extend(range(d, d + S))
            self._ring_next = (self._ring_next + 1) % ring
            self._special_dropped += 1
        sp = np.asarray(self._special_pages, dtype=np.int64)
        src_t, dst_t = (np.asarray(x, dtype=np.int64) for x in (src, dst))
        src_flat = torch.as_tensor(sp[src_t // P] * P + src_t % P).to(self.device)
        dst_flat = torch.as_tensor(sp[dst_t // P] * P + dst_t % P).to(self.device)
        L, N, H, D = self.num_layers, self.num_pages, self.num_heads, self.head_dim
        for pool in (self.k_pool, self.v_pool):      # one copy for every layer
            flat = pool.view(L, N * P, H, D)
            flat[:, dst_flat] = flat[:, src_flat]
        self._special_len = cap
        keep = math.ceil(cap / P)
        for p in self._special_pages[keep:]:
            self._release(p)
        del self._special_pages[keep:]

    def _require_step(self) -> StepTable:
        if self._step is None:
            raise KVCacheError("KV cache: no step in progress (call begin_step first)")
        return self._step

    # ------------------------------------------------------------------ inspection
    @property
    def step(self) -> Optional[StepTable]:
        return self._step

    @property
    def scale_pages(self) -> tuple:
        return tuple(self._scale)

    @property
    def window_pages(self) -> tuple:
        """Window pages, oldest first."""
        return tuple(self._window)

    @property
    def special_pages(self) -> tuple:
        return tuple(self._special_pages)

    @property
    def free_pages(self) -> tuple:
        return tuple(self._free)

    @property
    def special_len(self) -> int:
        """Committed special tokens."""
        return self._special_len

    @property
    def frames_committed(self) -> int:
        """Frames committed so far (scale + keyframes), including evicted ones."""
        return self._frames_committed

    def state(self) -> dict:
        """Every table and counter (for exact-rollback checks and debugging)."""
        return {
            "free": tuple(self._free), "scale": tuple(self._scale), "window": tuple(self._window),
            "special_pages": tuple(self._special_pages), "special_len": self._special_len,
            "ring_next": self._ring_next, "frames_committed": self._frames_committed,
            "evictions": self._evictions, "special_dropped": self._special_dropped,
        }

    def committed_slots(self) -> torch.Tensor:
        """Flat pool slots (page * page_size + offset) holding committed data: every token of
        scale and window pages and the committed special tokens."""
        P = self.page_size
        full = np.asarray(self._scale + self._window, dtype=np.int64)
        slots = (full[:, None] * P + np.arange(P)[None, :]).ravel()
        t = np.arange(self._special_len, dtype=np.int64)
        if len(t):
            sp = np.asarray(self._special_pages, dtype=np.int64)
            slots = np.concatenate([slots, sp[t // P] * P + t % P])
        return torch.as_tensor(slots)

    def stats(self) -> dict:
        step = self._step
        pending = (len(step.new_pages) + len(step.pending_special_pages) + len(step.backup)
                   - len(step.borrowed)) if step else 0
        elem = self.k_pool.element_size()
        return {
            "pages_total": self.num_pages,
            "pages_free": len(self._free),
            "pages_scale": len(self._scale),
            "pages_window": len(self._window),
            "pages_special": len(self._special_pages) - (len(step.pending_special_pages) if step else 0),
            "pages_pending": pending,
            "page_size": self.page_size,
            "num_layers": self.num_layers,
            "cached_frames": len(self._scale) + len(self._window),
            "special_frames": self._special_len // self.special_tokens if self.special_tokens else 0,
            "special_tokens": self._special_len,
            "special_cap": self.special_cap,
            "special_dropped": self._special_dropped,
            "frames_committed": self._frames_committed,
            "evictions": self._evictions,
            "window": self.window,
            "scale_frames": self.scale_frames,
            "visible_tokens": self._last_visible_tokens,
            "zero_copy": self._last_zero_copy,
            "bytes_allocated": 2 * self.k_pool.numel() * elem,
            "bytes_per_page": 2 * self.num_layers * self.page_size * self.num_heads * self.head_dim * elem,
            "dtype": str(self.dtype).replace("torch.", ""),
            "backend": self.backend.name,
            "device": str(self.device),
        }

    def page_map(self) -> np.ndarray:
        """int8 per page (every layer shares the tables): 0 free, 1 scale, 2 window, 3 special,
        4 pending (allocated by the step in progress)."""
        m = np.zeros(self.num_pages, dtype=np.int8)
        m[self._scale] = PAGE_SCALE
        m[self._window] = PAGE_WINDOW
        m[self._special_pages] = PAGE_SPECIAL
        if self._step is not None:
            m[self._step.new_pages] = PAGE_PENDING
            m[self._step.pending_special_pages] = PAGE_PENDING
            m[self._step.backup] = PAGE_PENDING
        return m

    def __repr__(self) -> str:
        s = self.stats()
        return (f"PagedKVCache(layers={self.num_layers}, pages={self.num_pages}x{self.page_size}, "
                f"heads={self.num_heads}x{self.head_dim}, {s['dtype']}, {s['backend']}, "
                f"cached={s['cached_frames']}, specials={s['special_frames']})")
