"""Paged KV cache of the streaming global attention: `PagedKVCache` composes the page tables
(engine/kv/page_table.py, plain integers), the pools (engine/kv/pool.py, the tensors and their
dtype / quantization), an attention backend handed in from outside (engine/kv/backends.py; a
name is resolved there, never here) and an optional window compressor (engine/kv/compression.py).

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
serves every layer. Keys are stored as given (already qk-normed and RoPE'd) in the storage dtype,
which is exactly the dtype asked for (no silent downcast; fp8 / int8 quantize with scales, see
pool.py); q is converted once to the attention dtype and the output back to q's dtype. Global attention has no mask and the
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
``keyframes_only=True`` (VGGT's chunks, which never roll back) sets no step pages aside: keyframe
pages start at page 0, and with ``scale_frames=0`` the pool is exactly ``window`` patch pages.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from ..host_copy import upload
from ..models.sections import section
from . import resolve as _resolve
from .attention import store_refusal
from .compression import Compressor
from .dtypes import KVPrecision, parse_dtype  # noqa: F401  (parse_dtype: public)
from .page_table import (  # noqa: F401  (re-exported)
    PAGE_FREE, PAGE_PENDING, PAGE_SCALE, PAGE_SPECIAL, PAGE_WINDOW, CommitPlan, KVCacheError, PageTable,
    StepTable, page_slots,
)
from .pool import KVPool


class PagedKVCache:
    """Paged KV cache of all global-attention layers (see the module docstring).

    dtype: storage ("fp32" | "bf16" | "fp16" | "fp8" | "int8", a torch dtype, or a `KVPrecision`);
    attn_dtype: what a quantized store computes attention in (default fp32; sessions pass their
    compute dtype). backend: a backend name (the choice from the declarations: engine/kv/resolve.py;
    `backend_choice` keeps it and the reasons other backends were refused) or a backend class.
    compression: a `Compressor` (engine/kv/compression.py) or None."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, patch_tokens: int,
                 special_tokens: int = 6, scale_frames: int = 8, window: int = 64,
                 special_cap: int = 1024, dtype: Any = torch.float32, device: Any = "cpu",
                 backend: Any = "sdpa", max_step_frames: int = 1, attn_dtype: Any = None,
                 compression: Optional[Compressor] = None, keyframes_only: bool = False):
        for name, val, lo in (("num_layers", num_layers, 1), ("num_heads", num_heads, 1),
                              ("head_dim", head_dim, 1), ("patch_tokens", patch_tokens, 1),
                              ("special_tokens", special_tokens, 0), ("scale_frames", scale_frames, 0),
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
        if isinstance(dtype, KVPrecision):
            self.precision = dtype
        else:
            storage = parse_dtype(dtype, allow_quantized=True)
            quantized = storage in (torch.int8, torch.float8_e4m3fn)
            attn = parse_dtype(attn_dtype or "fp32") if quantized else storage
            self.precision = KVPrecision(storage, attn, quantized)
        self.dtype = self.precision.storage          # what is stored (pool element type)
        self.attn_dtype = self.precision.attn
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise KVCacheError("KV cache: device 'cuda' was asked for but CUDA is not available")
        self.compression = compression or Compressor()
        keep = self.compression.keep_tokens(self.page_size) if self.compression.stores_fewer else None
        self.table = PageTable(self.page_size, self.special_tokens, self.scale_frames, self.window,
                               self.special_cap, self.max_step_frames, keep_tokens=keep,
                               keyframes_only=keyframes_only)
        self.num_pages = self.table.num_pages
        self.pool = KVPool(self.num_layers, self.num_pages, self.page_size, self.num_heads, self.head_dim,
                           self.precision, self.device)
        if self.compression.sparse_attention:
            self.pool.enable_block_means(self.compression.block_size)
        layout = ("block_sparse" if self.compression.sparse_attention else
                  "token_slots" if self.compression.stores_fewer else "pages")
        if isinstance(backend, str) or backend is None:
            self.backend_choice = _resolve.choose_backend(backend, self.device, self.precision, self.head_dim, layout)
        else:                            # a class handed in (tests, benchmarks): its store / layout only
            why = store_refusal(backend, self.precision, layout)
            if why is not None:
                raise KVCacheError(f"{why}; use backend 'sdpa' (or 'auto')")
            self.backend_choice = _resolve.Choice(backend.name, backend)
        self.backend = self.backend_choice.backend
        self._attn = self.backend.create(self)
        self._frame_counter = 0
        self.reset()

    @property
    def attention(self):
        """The attention backend instance (its `kernel`, `path`, `calls`, `error`: benchmarks and
        stats read them here)."""
        return self._attn

    # ------------------------------------------------------------------ pools
    @property
    def k_pool(self) -> torch.Tensor:
        return self.pool.k

    @property
    def v_pool(self) -> torch.Tensor:
        return self.pool.v

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget every cached frame (pool bytes are left as they are; nothing is reallocated)."""
        self.table.reset()
        self.pool.reset_scales()
        self._last_visible_tokens = 0
        self._last_zero_copy = None
        self._frame_counter = 0

    # ------------------------------------------------------------------ step protocol
    def begin_step(self, num_frames: int, scale: bool = False, keyframe: bool = True) -> StepTable:
        """Reserve pages for `num_frames` new frames and build the visible table (all layers)."""
        step = self.table.begin_step(num_frames, scale=scale, keyframe=keyframe)
        if step.slot_moves is not None:          # pack the compressed window (page_table docstring)
            self.pool.copy_slots(*step.slot_moves)
        self.pool.attach(step)
        if self.compression.sparse_attention and not scale:
            P = self.page_size
            a = len(self.table._scale) * P
            step.window_range = (a, a + len(self.table._window) * P)
            # a persistent buffer per length: a whole-step graph reads the current step's pages
            step.window_pages_t = self.pool._index("window_pages", self.table._window)
            step.sparse_runs = self.table.scale_special_runs(step)
            if step.slots_t is None:              # an int8 store uploaded the same list already
                step.slots_t = (step.int8_slots_t if step.int8_slots_t is not None else
                                upload(page_slots(step.pages, P, step.num_kv_tokens), self.device, torch.int64))
        self._last_visible_tokens = step.num_kv_tokens
        self._last_zero_copy = step.contiguous is not None and step.slots_t is None and self.pool.kind != "int8"
        self._attn.plan(step)
        return step

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new frames' keys/values of one layer: k, v [F, T, H, D], T = specials +
        patches in that order, already qk-normed and RoPE'd. Converted once to the storage dtype."""
        step = self._require_step()
        F, T = step.num_frames, self.special_tokens + self.page_size
        want = (F, T, self.num_heads, self.head_dim)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise KVCacheError(f"KV cache write: expected k, v of shape {list(want)}, "
                               f"got {list(k.shape)} and {list(v.shape)}")
        self.pool.write(layer, step, k, v, self.special_tokens)
        step.written[layer] = True

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [F, T, H, D] (any float dtype) -> [F, T, H, D] in q's dtype: every query attends (no
        mask) to the visible set: scale patches, window patches (or their kept tokens), the new
        frames, and the cached special tokens."""
        step = self._require_step()
        F, T = step.num_frames, self.special_tokens + self.page_size
        want = (F, T, self.num_heads, self.head_dim)
        if tuple(q.shape) != want:
            raise KVCacheError(f"KV cache attend: expected q of shape {list(want)}, got {list(q.shape)}")
        if not step.written[layer]:
            raise KVCacheError(f"KV cache attend: layer {layer} was not written in this step")
        qf = q.reshape(F * T, self.num_heads, self.head_dim)
        qa = qf if qf.dtype == self.attn_dtype else qf.to(self.attn_dtype)
        # block_sparse: this layer's token list, unless the backend selects the blocks itself
        # (the split's fixed-shape steps: `sparse_block_slots`)
        sparse = step.window_range is not None and not self._attn.selects_blocks()
        slots_t = self._sparse_slots(layer, step, qa) if sparse else None
        with section("global_attention"):       # a profiler range / a benchmark's timer
            out = self._attn.attend(step, qa, layer, slots_t=slots_t)
        return out.reshape(want).to(q.dtype)

    def enable_static_steps(self) -> bool:
        """Ask the backend to attend with fixed shapes and pointers where it can (whole-step CUDA
        graphs, engine/lingbot/model.py); False when it declares no such mode."""
        if not self._attn.support.fixed_shapes:
            return False
        self._attn.static = True
        return True

    def static_key(self):
        """For the step in progress: a key equal exactly when two steps launch the same kernels on
        the same buffers (every index the step writes or reads lives in a persistent device
        buffer), so one captured graph replays all of them; None when the step is not static
        (the backend's fallback steps, a block-sparse or compressed window still filling,
        another backend)."""
        step = self.table.step
        if step is None or not self._attn.support.fixed_shapes:
            return None
        if step.window_range is not None:        # block_sparse: fixed runs, blocks picked on the device
            if step.sparse_runs is None:
                return None
        elif step.slots_t is not None and step.token_runs is None:
            return None
        return self._attn.static_key()

    def _sparse_slots(self, layer: int, step: StepTable, q: torch.Tensor) -> torch.Tensor:
        """block_sparse: the visible slots of this layer: scale, the window blocks the compressor
        picks from the stored block means (no gather of the window's keys), own and specials."""
        a, b = step.window_range
        if b <= a:
            return step.slots_t
        means = self.pool.block_means[layer].index_select(0, step.window_pages_t)
        sel = self.compression.block_tokens(self.compression.select_blocks(q, means), self.page_size)
        dev = step.slots_t.device
        idx = torch.cat([torch.arange(a, device=dev), a + sel, torch.arange(b, step.slots_t.numel(), device=dev)])
        return step.slots_t.index_select(0, idx)

    def sparse_block_slots(self, layer: int, q: torch.Tensor):
        """block_sparse, for a backend that attends the window's chosen blocks itself: (slots, valid)
        = the pool's flat slots of the blocks the compressor picks for this layer from the stored
        block means (the same choice as `_sparse_slots`), a fixed-length list whose first `valid`
        (a device scalar) are the tokens (BlockSparse.block_slots); no host read."""
        step = self._require_step()
        means = self.pool.block_means[layer].index_select(0, step.window_pages_t)
        chosen = self.compression.top_blocks(q, means)
        return self.compression.block_slots(chosen, step.window_pages_t, self.page_size)

    def sparse_gather_tokens(self) -> int:
        """The most tokens `sparse_block_slots` hands out (a full window, every frame a keyframe
        or not): what a backend's gather scratch for the chosen blocks holds."""
        c = self.compression
        return c.kept_blocks(self.window * c.blocks_per_page(self.page_size)) * c.block_size

    def end_step(self) -> None:
        """Keyframe: commit (evictions already done, special cap applied, compressed copies made).
        Non-keyframe: restore every table, counter and the free list exactly as before `begin_step`
        (committed pool bytes are never written)."""
        step = self._require_step()
        plan = self.table.end_step()
        if step.keyframe:
            self._execute(plan)
            self._frame_counter += step.num_frames

    def _execute(self, plan: CommitPlan) -> None:
        self.pool.copy_slots(plan.special_src, plan.special_dst)
        if plan.compress:
            # every layer at once where the store allows (a few launches a frame, no host sync);
            # a quantized store re-quantizes layer by layer with that layer's scales
            K = self.table.keep_tokens
            for i, (page, first) in enumerate(plan.compress):
                dst = torch.arange(first, first + K, device=self.device)
                frame = self._frame_counter + i
                if self.pool.kind == "native":
                    k, v = self.pool.k[:, page], self.pool.v[:, page]          # [L, P, H, D]
                    kk, vv = self.compression.kept_layers(k, v, frame)
                    self.pool.write_slots_layers(dst, kk, vv)
                    continue
                for layer in range(self.num_layers):
                    k, v = self.pool.read_page(layer, page)
                    kk, vv = self.compression.kept(k, v, layer, frame)
                    self.pool.write_slots(layer, dst, kk, vv)

    def abort_step(self) -> None:
        """Undo a step that failed half-way (e.g. an exception inside a layer). Tables return to
        their state before `begin_step`, except that window frames a keyframe already evicted stay
        evicted (their pages may have been overwritten)."""
        self.table.abort_step()

    def _require_step(self) -> StepTable:
        return self.table._require_step()       # the step in progress is the table's

    # ------------------------------------------------------------------ inspection
    @property
    def step(self) -> Optional[StepTable]:
        return self.table.step

    @property
    def scale_pages(self) -> tuple:
        return tuple(self.table._scale)

    @property
    def window_pages(self) -> tuple:
        """Window pages (compact frame slots when the window is compressed), oldest first."""
        return tuple(self.table._window)

    @property
    def special_pages(self) -> tuple:
        return tuple(self.table._special_pages)

    @property
    def free_pages(self) -> tuple:
        return tuple(self.table._free)

    @property
    def special_len(self) -> int:
        """Committed special tokens."""
        return self.table._special_len

    @property
    def frames_committed(self) -> int:
        """Frames committed so far (scale + keyframes), including evicted ones."""
        return self.table._frames_committed

    def state(self) -> dict:
        """Every table and counter (for exact-rollback checks and debugging)."""
        return self.table.state()

    def committed_slots(self) -> torch.Tensor:
        """Flat pool slots (page * page_size + offset) holding committed data."""
        return torch.as_tensor(self.table.committed_slots())

    def stats(self) -> dict:
        out = self.table.counts()
        out.update({
            "num_layers": self.num_layers,
            "visible_tokens": self._last_visible_tokens,
            "zero_copy": self._last_zero_copy,
            "bytes_allocated": self.pool.bytes_allocated,
            "bytes_per_page": int(round(self.pool.bytes_per_token * self.page_size)),
            "bytes_kept": int(round(out["kept_tokens"] * self.pool.bytes_per_token)),
            "dtype": str(self.dtype).replace("torch.", ""),
            "attn_dtype": str(self.attn_dtype).replace("torch.", ""),
            "compression": self.compression.name,
            "fp8_saturated": int(self.pool.saturated) if self.pool.kind == "fp8" else None,
            "backend": self.backend.name,
            "backend_choice": self.backend_choice.stats(),
            "attention": self._attn.describe(),
            "device": str(self.device),
        })
        paths = getattr(self._attn, "path_stats", None)
        if paths is not None:            # which kernels the backend's steps took (benchmarks)
            out["attention_paths"] = paths()
        return out

    def page_map(self) -> np.ndarray:
        """int8 per page (every layer shares the tables): 0 free, 1 scale, 2 window, 3 special,
        4 pending (allocated by the step in progress)."""
        return self.table.page_map()

    def __repr__(self) -> str:
        s = self.stats()
        return (f"PagedKVCache(layers={self.num_layers}, pages={self.num_pages}x{self.page_size}, "
                f"heads={self.num_heads}x{self.head_dim}, {s['dtype']}, {s['backend']}, "
                f"{s['compression']}, cached={s['cached_frames']}, specials={s['special_frames']})")
