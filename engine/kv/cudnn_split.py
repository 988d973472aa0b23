"""The cuDNN split backend (backend name ``cudnn-split``, what "auto" takes on CUDA for a native
bf16/fp16 store): in the steady state the patch pages, whose length is constant from frame to
frame, go through plain cuDNN without a mask (one graph for the run) and the special tokens
through flash, the two results merged exactly by their log-sum-exp; every other step through
FlashInfer (else SDPA). See `CuDNNSplitBackend`.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..models.layers import CUDNN_Q_TILE, cudnn_one_wave
from .attention import LAYOUTS, STORES, Backend, Support, refusal
from .backends import FlashInferBackend, SDPABackend
from .cudnn import CUDNN_HEAD_DIMS
from .cudnn_kernels import (chunk_bounds, chunked_lse, even_chunks, masked_lse, merge_lse, tail_chunks,
                            torch_cudnn, torch_cudnn_lse, torch_flash_lse, torch_flash_varlen_lse)
from .dtypes import FP8
from .page_table import StepTable


class CuDNNSplitBackend(Backend):
    """The steady-state global attention split into a FIXED-length part, attended by plain cuDNN
    (no mask: its fast path, faster than FlashInfer at the steady state's key count) through
    ONE graph for the run, and a small variable part attended by a kernel with no per-length
    set-up (PyTorch flash), merged exactly by log-sum-exp (`merge_lse`). Backend "cudnn-split".

    Split point, from the step's host integers only (no device reads, no sync): in a contiguous
    step (`StepTable.contiguous`: the window is full, paged_cache "Placement") the pages are the
    patch pages (scale + window + the new frame) -- a run whose length is constant from frame to
    frame: 72 pages from page 1 for a keyframe, 73 from page 0 for a non-keyframe at window 64 --
    followed by the special pages, whose visible length grows by `special_tokens` a frame up to the
    cap and whose last page is partial. Part A = the patch pages, viewed in place as
    [pages * page_size, H, D] (cuDNN graph keyed by that constant shape); part B = the special
    tokens, the rest of the run (a view, `special_start + special_tokens * frames` long).
    Once the special ring is full too (`StepTable.fixed_length`: after `special_cap` frames) the
    whole run has one length for good, so it needs no split: one plain cuDNN call without
    statistics (`torch_cudnn`, `kernel_full`).
    Figures against FlashInfer and the split: docs/history/benchmarks_h200_issue11.md "Fixed-length
    steps".
    A block_sparse step once the window is full (`StepTable.sparse_runs`, native stores) attends
    in three parts (`_attend_sparse`): A = the scale pages (constant), the step's own page and the
    window blocks chosen for the layer gathered into a scratch of fixed length with the token count
    on the device (varlen flash), and B; static like a split step.
    Every other step -- the window filling (special pages apart from the patch pages), token slots
    (compressed window still filling, block-sparse over a quantized store), a run not laid out as
    above, an A length beyond `max_shapes` distinct ones (a graph each) -- and every call after a
    kernel failure (`error`) go to the fallback backend: FlashInfer (dense / paged) where it runs,
    else SDPA.
    Native bf16/fp16 stores, and fp8 stores attended in bf16/fp16 (the run read into 16-bit
    scratch: e4m3 -> bf16 is exact); int8 always falls back.
    `static` (set for whole-step CUDA graphs): part B attends the fixed special zone with its
    length read on the device, so a split step's kernels and buffers depend only on its kind
    (`static_key`); the model then replays each streamed step as one graph.
    Measurements: docs/benchmarks.md "cuDNN split"."""

    name = "cudnn-split"
    support = Support(devices=("cuda",), compute_dtypes=(torch.bfloat16, torch.float16), stores=STORES,
                      layouts=LAYOUTS, fixed_shapes=True, head_dims=CUDNN_HEAD_DIMS, auto_stores=STORES,
                      note="the window filling and block-sparse over a quantized store go to the fallback "
                           "(FlashInfer, else SDPA); 'auto' takes it for every store attended in bf16/fp16 "
                           "(fp8 / int8 read into 16-bit scratch; faster than FlashInfer's fp8-KV kernel: "
                           "docs/benchmarks_kv.md)")
    mode = "split"

    # q rows per cuDNN work tile (its SM90 forward kernels): ceil(q / 128) x heads CTAs a call
    Q_TILE = CUDNN_Q_TILE
    tail_min_keys = 1024           # keys per chunk of the wave tail at least (`tail_chunks`)

    def __init__(self, cache, kernel_a=None, kernel_b=None, fallback=None, max_shapes: int = 4,
                 wave_sms: Optional[int] = -1, kernel_full=None, whole: bool = True, kernel_b_static=None,
                 tail: bool = True):
        """kernel_a / kernel_b: (q, k, v) -> (out [n, H, D], lse [H, n] float32, natural log); by
        default `torch_cudnn_lse` and `torch_flash_lse`. fallback: a backend instance for the
        other steps (tests pass one).
        kernel_full: (q, k, v) -> out [n, H, D] for a fixed-length step attended whole (default
        `torch_cudnn`); whole: whether such steps are (tests compare with the split form).
        An fp8 store: the run's e4m3 keys/values are read into a 16-bit scratch pair (allocated
        once, the pool's capacity; e4m3 values are exact in bf16), the per-head key scales folded
        into q and the value scales applied to the output; then it attends as a native store.
        kernel_b_static: (q, k, v, cu_q, cu_k) -> (out, lse) over the first cu_k[1] keys of a fixed
        view, the length read on the device (default `torch_flash_varlen_lse` on CUDA, else
        `masked_lse`): part B of a static step (`static`, below).
        wave_sms: the split's cuDNN call takes only the query rows that fit ONE wave of work
        tiles, ceil(q tokens / Q_TILE) x heads <= wave_sms (-1 = the GPU's SM count, no limit on
        the CPU; None = no limit): a second, nearly empty wave costs more than the rows it adds
        (docs/benchmarks.md "wave tail"). The remaining "wave tail" rows attend the same keys
        through `chunked_lse` (tail=False: such steps go to the fallback; tests)."""
        self.cache = cache
        pool = cache.pool
        self.fallback_refused = None               # why FlashInfer is not the fallback, if it is not
        dev = torch.device(cache.device)
        cuda = dev.type == "cuda"
        if wave_sms == -1:
            wave_sms = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else None
        self.wave_sms = wave_sms
        self.wave_declined = 0                     # steps sent to the fallback for their q size
        self.tail = bool(tail)
        self.wave_tail_steps = 0                   # steps whose rows past one wave went to chunked_lse
        self._tail = {}                            # (rows, keys) -> chunked_lse's (chunks, bounds, kernel)
        self._rows = 0                             # the planned step's rows for the cuDNN call
        self.capacity = pool.num_pages * pool.page_size
        self.max_shapes = int(max_shapes)
        self.error = None
        self.path = None                           # "split" | "whole" | "fallback": the last attend's
        self.calls = {"split": 0, "whole": 0, "fallback": 0, "sparse": 0}
        self.a_shapes: set = set()                 # (q tokens, A pages) handed to the fixed kernel
        self.whole_shapes: set = set()             # (q tokens, K/V tokens) attended whole
        self.whole = bool(whole)
        self.fp8 = pool.kind == "fp8"              # read into 16-bit scratch (above)
        self._scratch = None                       # (k, v) 16-bit scratch of a quantized store
        attn16 = cache.attn_dtype in (torch.bfloat16, torch.float16)
        self._ok = pool.kind in ("native", "fp8", "int8") and (kernel_a is not None or attn16)
        self._kernel_a = kernel_a or torch_cudnn_lse
        self._kernel_b = kernel_b or torch_flash_lse
        if kernel_full is None and not cuda:
            self.whole = False           # no cuDNN off the GPU (CPU tests pass a stand-in)
        self._kernel_full = kernel_full or torch_cudnn
        self.kernel = "cudnn-split (cuDNN + flash, merged by log-sum-exp)"
        if pool.kind != "native":
            self.kernel = (f"cudnn-split {pool.kind} store (cuDNN + flash on 16-bit scratch, merged by "
                           f"log-sum-exp)")
        if fallback is None:
            # the fallback from the declarations too: FlashInfer where it can serve this cache
            fi = refusal(FlashInferBackend, cache.device, cache.precision, pool.head_dim)
            fallback = FlashInferBackend.create(cache) if fi is None else SDPABackend.create(cache)
            self.fallback_refused = fi
        self._fallback = fallback
        self._split = None          # (first page, A pages, B tokens, whole) of the step, or None
        # block_sparse steps with fixed runs (`StepTable.sparse_runs`): the gathered part's length
        # (the step's own tokens + the chosen blocks' slots), else None; its gather scratch
        self._sparse = None
        self._sparse_kv = None
        # Static steps (set by the session for whole-step CUDA graphs, engine/lingbot/model.py):
        # part B attends a FIXED view -- the special zone, from the end of the patch run to the
        # end of the pool -- whose visible length is an int32 device tensor written in `plan`, so
        # a split step's shapes and pointers depend only on its kind (`static_key`).
        self.static = False
        self._kernel_b_static = kernel_b_static or (torch_flash_varlen_lse if cuda else masked_lse)
        self._cu_q = self._cu_k = None      # int32 [2] device tensors [0, q tokens], [0, B tokens]

    @staticmethod
    def scratch_bytes(capacity_tokens: int, num_heads: int, head_dim: int, kind: str, attn_bytes: int = 2) -> int:
        """Bytes of the 16-bit scratch pair a quantized store ("fp8" / "int8") is read into (the
        pool's capacity for one layer, allocated at the first split step); 0 for a native store.
        For memory accounting (engine/memory_plan.py)."""
        return 0 if kind == "native" else 2 * capacity_tokens * num_heads * head_dim * attn_bytes

    def split_point(self, step: StepTable):
        """(A's first flat slot, A tokens, B's first flat slot, B tokens) when the step has the
        layout above, else None. A compressed window gives its two runs (`StepTable.token_runs`,
        engine/kv/page_table.py): A = step, scale and packed window tokens, B = the specials. A
        block_sparse step with a full window gives the scale pages as A and the specials as B
        (`StepTable.sparse_runs`); its own page and chosen window blocks are gathered per layer
        (`_attend_sparse`; native stores only)."""
        if step.window_range is not None:
            if step.sparse_runs is None or self.cache.pool.kind != "native":
                return None
            (a0, na), (b0, nb) = step.sparse_runs
            return (a0, na, b0, nb) if na > 0 else None
        if step.token_runs is not None:
            (a0, na), (b0, nb) = step.token_runs
            return (a0, na, b0, nb) if na > 0 and na + nb == step.num_kv_tokens else None
        if step.contiguous is None or step.slots_t is not None:
            return None
        c = self.cache
        P, S = c.page_size, c.special_tokens
        b = step.special_start + S * step.num_frames          # visible special tokens
        n_sp = -(-b // P)
        first, m = step.contiguous
        n_a = m - n_sp
        if n_a <= 0 or n_a * P + b != step.num_kv_tokens:
            return None
        patch = step.pages[:n_a]                                 # scale -> window -> new
        if min(patch) != first or max(patch) != first + n_a - 1:
            return None                                          # specials not after the patch pages
        return first * P, n_a * P, (first + n_a) * P, b

    def path_stats(self) -> dict:
        """Layer calls per path, the distinct cuDNN shapes (a graph each), the steps declined for
        their q size, the kernel error if any (PagedKVCache.stats "attention_paths")."""
        return {"calls": dict(self.calls), "split_shapes": len(self.a_shapes),
                "whole_shapes": len(self.whole_shapes), "whole": self.whole,
                "wave_declined": self.wave_declined, "wave_tail_steps": self.wave_tail_steps,
                "wave_tails": [f"{t} rows x {L} keys: {c} {kind} chunks"
                               for (t, L), (c, _, kind) in sorted(self._tail.items())],
                "error": self.error}

    def fits_one_wave(self, q_tokens: int) -> bool:
        """The cuDNN call's work tiles for `q_tokens` queries fit one wave of the GPU (see __init__)."""
        if self.wave_sms is None:
            return True
        return cudnn_one_wave(1, q_tokens, self.cache.pool.num_heads, self.wave_sms, self.Q_TILE)

    def wave_rows(self, q_tokens: int) -> int:
        """The query rows of a step that cuDNN attends in one wave: all of them when they fit,
        else whole tiles for every head (0 when not even one tile a head fits)."""
        if self.wave_sms is None:
            return q_tokens
        return min(q_tokens, (self.wave_sms // self.cache.pool.num_heads) * self.Q_TILE)

    def plan(self, step: StepTable) -> None:
        split = self.split_point(step) if self._ok and self.error is None else None
        self._rows = step.q_tokens
        rows = self.wave_rows(step.q_tokens)
        if split is not None and rows < step.q_tokens:        # not one wave: a tail, or decline
            if self.tail and rows > 0:
                self._rows = rows
                self.wave_tail_steps += 1
            else:
                split = None
                self.wave_declined += 1
        sparse = split is not None and step.window_range is not None
        if split is not None:
            whole = (not sparse and self.whole and step.fixed_length
                     and split[2] == split[0] + split[1])                       # one run
            shapes, key = ((self.whole_shapes, (step.q_tokens, step.num_kv_tokens)) if whole
                           else (self.a_shapes, (step.q_tokens, split[1])))
            if key not in shapes:
                if len(shapes) >= self.max_shapes:
                    split = None                                 # no further graphs: fall back
                else:
                    shapes.add(key)
            if split is not None:
                split = (*split, whole)
        self._split = split
        self._sparse = None
        if split is not None and sparse:       # own tokens + the chosen blocks (fixed per step kind)
            c = self.cache
            windowed = (step.window_range[1] - step.window_range[0]) // c.page_size
            comp = c.compression
            self._sparse = (step.num_frames * c.page_size
                            + comp.kept_blocks(windowed * comp.blocks_per_page(c.page_size)) * comp.block_size)
        if split is None:
            self._fallback.plan(step)
        elif (self.static and not split[4]) or sparse:
            if self._cu_q is None:
                self._cu_q = torch.zeros(2, dtype=torch.int32, device=self.cache.device)
                self._cu_k = torch.zeros(2, dtype=torch.int32, device=self.cache.device)
            self._cu_q[1:].fill_(step.q_tokens)      # kernels with the values as arguments:
            self._cu_k[1:].fill_(split[3])           # no host sync, stream-ordered

    def static_key(self):
        """For a planned step attended with fixed shapes and pointers (`static`, split or whole):
        a key that is equal exactly when two steps launch the same kernels on the same buffers --
        what a whole-step CUDA graph can be keyed by; None otherwise (fallback steps, `static`
        off, after an error)."""
        if not self.static or self._split is None or self.error is not None:
            return None
        a0, na, b0, nb, whole = self._split
        if self._sparse is not None:
            return ("sparse", a0, na, self._sparse, b0)
        if whole:
            return ("whole", a0, na + nb)
        return ("split", a0, na, b0)

    def selects_blocks(self) -> bool:
        """A block_sparse step planned on the split picks its blocks here (`_attend_sparse`)."""
        return self._sparse is not None and self._split is not None and self.error is None

    def attend(self, step: StepTable, q: torch.Tensor, layer: int, slots_t=None):
        if self._split is not None and slots_t is None and self.error is None:
            try:
                out = (self._attend_sparse(step, q, layer) if self._sparse is not None
                       else self._attend_split(q, layer))
            except Exception as exc:   # a kernel rejected the call: the fallback from now on
                self.error = f"{type(exc).__name__}: {exc}"[:500]
                self._split = None
                sparse, self._sparse = self._sparse, None
                self._fallback.plan(step)
                if sparse is not None:     # this layer's token list, as the cache makes it
                    slots_t = self.cache._sparse_slots(layer, step, q)
            else:
                self.path = ("sparse" if self._sparse is not None else "whole" if self._split[4]
                             else "split")
                self.calls[self.path] += 1
                return out
        self.path = "fallback"
        self.calls["fallback"] += 1
        return self._fallback.attend(step, q, layer, slots_t=slots_t)

    def _attend_split(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        pool = self.cache.pool
        a0, na, b0, nb, whole = self._split
        H = pool.num_heads
        q = q.contiguous()
        static_b = self.static and not whole
        full, part_a, part_b = self._kernel_full, self._kernel_a, self._kernel_b
        if whole:                      # one fixed-length run: no statistics, no merge
            ka, va = self._run(layer, a0, na + nb)
            q = self._scaled_q(q, layer)
            out = self._wave_tail(q, ka, va, lambda *a: (full(*a), None))[0]
        else:
            # static: B is the run to the end of the pool (a fixed view), its length on the device
            b_len = pool.num_pages * pool.page_size - b0 if static_b else nb
            ka, va = self._run(layer, a0, na)                     # constant shape
            kb, vb = self._run(layer, b0, b_len)
            q = self._scaled_q(q, layer)
            out, lse_a = self._wave_tail(q, ka, va, part_a)
            if static_b or nb:
                out_b, lse_b = (self._kernel_b_static(q, kb, vb, self._cu_q, self._cu_k)
                                if static_b else part_b(q, kb, vb))
                out = merge_lse(out, lse_a, out_b, lse_b)
        if self.fp8:                   # attention is linear in V: the value scales last
            out = (out.float() * pool.scales[layer, 1].view(1, H, 1)).to(q.dtype)
        return out

    def _attend_sparse(self, step: StepTable, q: torch.Tensor, layer: int) -> torch.Tensor:
        """A block_sparse step with fixed runs, in three parts merged by log-sum-exp: A = the scale
        pages (a view, constant length: the cuDNN kernel); C = the step's own page and the window
        blocks the compressor picks for this layer (`PagedKVCache.sparse_block_slots`, the same
        choice the fallback's token list makes), gathered into a scratch of fixed length, the
        number of tokens read on the device (varlen flash); B = the special tokens as in a split
        step. Shapes depend on the step kind only (a keyframe sees one window frame fewer), and
        nothing is read back to the host: a whole-step graph replays it."""
        c, pool = self.cache, self.cache.pool
        a0, na, b0, nb, _ = self._split
        N, P, H, D = pool.num_pages, pool.page_size, pool.num_heads, pool.head_dim
        q = q.contiguous()
        ka, va = self._run(layer, a0, na)
        out, lse = self._wave_tail(q, ka, va, self._kernel_a)
        slots, valid = c.sparse_block_slots(layer, q)
        own = (step.new_pages_t[:, None] * P + torch.arange(P, device=q.device)).reshape(-1)
        idx = torch.cat([own, slots])
        if self._sparse_kv is None:    # once, for the largest step (allocated outside any capture)
            n = c.max_step_frames * P + c.sparse_gather_tokens()
            self._sparse_kv = tuple(torch.empty((n, H, D), dtype=pool.k.dtype, device=pool.device)
                                    for _ in range(2))
        kc = torch.index_select(pool.k[layer].view(N * P, H, D), 0, idx, out=self._sparse_kv[0][:idx.numel()])
        vc = torch.index_select(pool.v[layer].view(N * P, H, D), 0, idx, out=self._sparse_kv[1][:idx.numel()])
        cu_c = torch.stack([torch.zeros_like(valid), valid + own.numel()]).to(torch.int32)
        out_c, lse_c = self._kernel_b_static(q, kc, vc, self._cu_q, cu_c)
        out, lse = merge_lse(out, lse, out_c, lse_c), torch.logaddexp(lse, lse_c)
        if nb:
            if self.static:            # the fixed special zone, its length on the device
                kb, vb = self._run(layer, b0, N * P - b0)
                out_b, lse_b = self._kernel_b_static(q, kb, vb, self._cu_q, self._cu_k)
            else:
                kb, vb = self._run(layer, b0, nb)
                out_b, lse_b = self._kernel_b(q, kb, vb)
            out = merge_lse(out, lse, out_b, lse_b)
        return out

    def _scaled_q(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """fp8 store: the per-head key scales folded into q (else q as is)."""
        if not self.fp8:
            return q
        H = self.cache.pool.num_heads
        return (q.float() * self.cache.pool.scales[layer, 0].view(1, H, 1)).to(q.dtype)

    def _wave_tail(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel):
        """kernel(q, k, v) -> (out, lse) over all of q's rows, cuDNN (`kernel`) taking the rows that
        fit one wave and `chunked_lse` the rest, the results stacked by row (disjoint queries
        over the same keys: nothing to merge). lse is None when `kernel` returns none (whole)."""
        r = self._rows
        if r >= q.shape[0]:
            return kernel(q, k, v)
        t, L = q.shape[0] - r, k.shape[0]
        spec = self._tail.get((t, L))
        if spec is None:           # device kernels only: also safe inside a graph capture
            chunks = tail_chunks(t, q.shape[1], self.wave_sms, L, self.Q_TILE, self.tail_min_keys)
            even = even_chunks(L, chunks, self.tail_min_keys)
            # cuDNN's batched form where equal chunks give at least half the CTAs wanted, else
            # flash with any chunking (docs/benchmarks.md "wave tail")
            if 2 * even >= chunks:
                spec = (even, None, "cudnn")
            else:
                spec = (chunks, chunk_bounds(t, L, chunks, q.device), "flash")
            self._tail[(t, L)] = spec
        out_m, lse_m = kernel(q[:r], k, v)
        out_t, lse_t = chunked_lse(q[r:], k, v, *spec)
        out = torch.cat([out_m, out_t])
        return out, (None if lse_m is None else torch.cat([lse_m, lse_t], dim=1))

    def _run(self, layer: int, start: int, n: int):
        """The layer's keys / values of flat slots start .. start + n - 1 as [n, H, D]: zero-copy
        views of a native store; for a quantized store read into the same rows of the 16-bit
        scratch pair (fp8: as stored, e4m3 -> bf16/fp16 is exact, its per-head scales applied outside;
        int8: times its per-token scales, the same arithmetic as `KVPool.dequantize`). The
        scratch holds the pool's capacity and is allocated once (one layer at a time uses it);
        A and B land in disjoint rows, at addresses that depend on their slots only."""
        pool = self.cache.pool
        N, P, H, D = pool.num_pages, pool.page_size, pool.num_heads, pool.head_dim
        k = pool.k[layer].view(N * P, H, D)[start:start + n]
        v = pool.v[layer].view(N * P, H, D)[start:start + n]
        if pool.kind == "native":
            return k, v
        if self._scratch is None:
            self._scratch = tuple(torch.empty((N * P, H, D), dtype=self.cache.attn_dtype, device=pool.device)
                                  for _ in range(2))
        sk, sv = (x[start:start + n] for x in self._scratch)
        if self.fp8:
            sk.copy_(k.view(FP8))
            sv.copy_(v.view(FP8))
        else:                          # int8: per-token scales of the same slots (a view)
            sk.copy_(k).mul_(pool.scales[layer, 0, start:start + n, :, None])
            sv.copy_(v).mul_(pool.scales[layer, 1, start:start + n, :, None])
        return sk, sv
