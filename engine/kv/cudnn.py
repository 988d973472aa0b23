"""cuDNN attention backends over the paged KV cache (backend name ``cudnn``), beside SDPA and
FlashInfer in `engine.kv.backends` and through the same interface and page tables (this module
reads `StepTable`s; no bookkeeping of its own). CUDA, native bf16/fp16 stores.

PyTorch's cuDNN SDPA kernel over a FIXED key/value capacity -- each layer's whole
pool, read in place, the keys a step must not see hidden by an additive bias row built once per
step -- so cuDNN builds one graph for the whole run instead of one per visible length
(`CuDNNBackend`). Exact SDPA while the window fills. CUDA, native bf16/fp16 stores.
Not faster than FlashInfer (the bias takes cuDNN off its fast path; docs/benchmarks.md). When the
cuDNN frontend imports (pip nvidia-cudnn-frontend), `CuDNNBackend.create` takes the
SEQUENCE-LENGTH form instead (`CuDNNSeqLenBackend`): the visible length as an int32 device
tensor (cuDNN's padding mask) over a fixed K/V view, dense from the visible run's first page
or through cuDNN's page table; one graph per q length (and first page), no mask, no host sync.
`frontend_error` says why the bias form ran. The kernels: engine/kv/cudnn_kernels.py; the
split backend (``cudnn-split``): engine/kv/cudnn_split.py.
"""
from __future__ import annotations

import torch

from .attention import Backend, Support
from .backends import SDPABackend
from .cudnn_kernels import CUDNN_MASKED, CuDNNFrontendKernel, _cudnn_sdpa, _import_cudnn_frontend
from .page_table import KVCacheError, StepTable

# Below this fraction of the capacity visible, `CuDNNBackend` attends the visible keys with the exact
# SDPA path instead (the window-filling phase: attending 80k keys for 10k visible would cost more
# than it saves). The sequence-length form skips the hidden tail, so its default is 0.
CUDNN_MIN_FILL = 0.5
# cuDNN's fused attention: bf16/fp16, head dims that are multiples of 8 up to 256
CUDNN_HEAD_DIMS = tuple(range(8, 257, 8))


class CuDNNBackend(Backend):
    """cuDNN attention over a FIXED key/value capacity: every layer's whole page pool, read in place.

    PyTorch builds (and caches) one cuDNN graph per shape *and stride* of q, k, v and the bias;
    the streamed visible length changes every frame (+6 special tokens) and with keyframe
    rollbacks, which made cuDNN lose end to end when called on the visible keys (a graph rebuilt
    for every new length costs more than the kernel saves). Here k / v are always the layer's
    whole pool viewed as
    ``[capacity, H, D]`` (capacity = num_pages * page_size; a zero-copy view, the same shape and
    strides for every layer and step), and the keys a step must not see -- free pages, page 0 of a
    keyframe step, the unused part of the last special page -- are hidden by an additive bias row
    (0 visible, `CUDNN_MASKED` hidden) built once per step from the step's page table (or token
    slots) on the device, with no host sync. So one graph serves the whole run (one per q length:
    the scale step and streamed steps) and the call is CUDA-graph capturable (static shapes,
    pointers and mask buffer). The visible pages need not be one run: any page set is exact.
    The mask takes cuDNN off its fast path (slower than FlashInfer dense, docs/benchmarks.md), so
    this stays an opt-in alternative.

    PyTorch (2.11 .. 2.13) exposes no sequence-length / padding-mask form of cuDNN SDPA for dense
    inputs (`varlen_attn` refuses `seqused_k` on its cuDNN path), so the bias is the public way.

    Exact path (`SDPABackend`, flash kernel first on CUDA: same result to bf16 rounding): when
    less than `min_fill` of the capacity is visible (the window-filling phase: attending 80k keys
    for 10k visible would cost more than it saves), and for good after the cuDNN call failed once
    (`error` says why; e.g. a PyTorch/cuDNN that rejects the bias). Native bf16/fp16 stores only
    (cuDNN has no fp32 kernel; quantized stores go to flashinfer or sdpa). The pool is zeroed at
    creation: a hidden key is still multiplied (by probability 0), and uninitialised memory may
    hold NaN bit patterns, which 0 * NaN would spread."""

    name = "cudnn"
    support = Support(devices=("cuda",), compute_dtypes=(torch.bfloat16, torch.float16), stores=("native",),
                      head_dims=CUDNN_HEAD_DIMS,
                      note="reads the pool in place; token-slot steps attend exactly (SDPA)")
    kernel = "cudnn"
    mode = "bias"                     # "seqlen": CuDNNSeqLenBackend (cuDNN frontend)
    # what a failed fixed-capacity call may raise (then exact for good), and whether that call
    # takes a layer's own token list (block-sparse)
    _fixed_errors: tuple = (RuntimeError,)    # e.g. no cuDNN kernel for this bias
    _fixed_takes_slots = True
    frontend_error = None             # why create() did not take the sequence-length form

    def __init__(self, cache, kernel=None, min_fill: float = CUDNN_MIN_FILL):
        """kernel: the attention call (q, k, v, bias) -> out; default PyTorch's cuDNN SDPA (tests
        pass a stand-in, which may run any dtype on any device)."""
        self.cache = cache
        pool = cache.pool
        self._kernel = kernel or _cudnn_sdpa
        self.min_fill = float(min_fill)
        self.capacity = pool.num_pages * pool.page_size
        self.error = None             # why the fixed-capacity call was given up, if it was
        self.path = None              # "fixed" | "exact": what the last attend ran
        self.calls = {"fixed": 0, "exact": 0}
        self._exact = SDPABackend.create(cache)
        self._fixed_ok = pool.kind == "native" and (
            kernel is not None or cache.attn_dtype in (torch.bfloat16, torch.float16))
        self._bias = None
        if self._fixed_ok:
            pool.k.zero_()
            pool.v.zero_()
            # [1, 1, 1, capacity] in the attention dtype (an fp32 bias would be misread by cuDNN as
            # q's dtype in PyTorch < pytorch#191612)
            self._bias = torch.full((1, 1, 1, self.capacity), CUDNN_MASKED, dtype=cache.attn_dtype,
                                    device=pool.device)
        self._step_fixed = False      # the current step takes the fixed-capacity call

    @classmethod
    def create(cls, cache):
        """The sequence-length form through the cuDNN frontend when it can run here
        (`CuDNNSeqLenBackend`), else this bias form; `frontend_error` says why not."""
        reason = None
        if cache.pool.kind != "native" or cache.attn_dtype not in (torch.bfloat16, torch.float16):
            reason = f"the sequence-length form needs a native bf16/fp16 store (got {cache.pool.kind}, {cache.attn_dtype})"
        elif torch.device(cache.device).type != "cuda":
            reason = "the cuDNN frontend needs a CUDA device"
        else:
            mod, err = _import_cudnn_frontend()
            if mod is None:
                reason = f"the cuDNN frontend (pip nvidia-cudnn-frontend) does not import: {err}"
            else:
                return CuDNNSeqLenBackend(cache)
        be = cls(cache)
        be.frontend_error = reason
        return be

    # ------------------------------------------------------------------ mask
    def _mask_pages(self, step: StepTable) -> None:
        """Bias row: 0 on the step's visible pages (the last one up to last_page_len)."""
        P = self.cache.page_size
        row = self._bias.view(-1, P)
        row.fill_(CUDNN_MASKED)
        if len(step.pages) > 1:
            row.index_fill_(0, step.pages_t[:-1], 0.0)
        row[step.pages[-1], :step.last_page_len] = 0.0        # host integers: no sync

    def _mask_slots(self, slots_t: torch.Tensor) -> None:
        row = self._bias.view(-1)
        row.fill_(CUDNN_MASKED)
        row.index_fill_(0, slots_t, 0.0)

    # ------------------------------------------------------------------ protocol
    def plan(self, step: StepTable) -> None:
        """Once per step: decide the path and build the bias row (shared by all layers)."""
        self._step_fixed = (self._fixed_ok and self.error is None
                            and step.num_kv_tokens >= self.min_fill * self.capacity)
        if self._step_fixed:
            if step.slots_t is not None:
                self._mask_slots(step.slots_t)
            else:
                self._mask_pages(step)
            self._step_bias = self._bias

    def attend(self, step: StepTable, q: torch.Tensor, layer: int, slots_t=None):
        if self._step_fixed and self.error is None and (slots_t is None or self._fixed_takes_slots):
            try:
                out = self._attend_fixed(step, q, layer, slots_t)
            except self._fixed_errors as exc:     # exact from now on
                self.error = f"{type(exc).__name__}: {exc}"[:500]
            else:
                self.path = "fixed"
                self.calls["fixed"] += 1
                return out
        self.path = "exact"
        self.calls["exact"] += 1
        return self._exact.attend(step, q, layer, slots_t=slots_t)

    def _attend_fixed(self, step: StepTable, q: torch.Tensor, layer: int, slots_t=None):
        pool = self.cache.pool
        H, D = pool.num_heads, pool.head_dim
        bias = self._step_bias
        if slots_t is not None:           # block-sparse: this layer's own token list
            self._mask_slots(slots_t)
        k = pool.k[layer].view(self.capacity, H, D)           # zero copy, same shape every call
        v = pool.v[layer].view(self.capacity, H, D)
        qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q.contiguous(), k, v))
        return self._kernel(qh, kh, vh, bias)[0].transpose(0, 1)


class CuDNNSeqLenBackend(CuDNNBackend):
    """cuDNN attention with the visible length as a SEQUENCE LENGTH (cuDNN's padding mask) over a
    fixed-capacity K/V view, through the cuDNN frontend (`CuDNNFrontendKernel`): backend "cudnn"
    when the frontend imports (`CuDNNBackend.create`).

    PyTorch exposes cuDNN SDPA for dense inputs only without a length (a graph rebuilt per visible
    length) or with a bias mask (off cuDNN's fast path, docs/benchmarks.md). Here the length is an
    int32 device tensor the kernel reads, written once per step by `plan` (`fill_`, no host sync),
    and the keys past it are skipped whole tiles at a time, so the call costs what the visible keys
    cost and one graph serves the run:
    - dense form (a contiguous visible run, the steady state): k / v are the layer's pool viewed
      from the run's first page as [tokens, H, D] (zero copy); seq_kv = the visible tokens. One
      graph per (q length, first page): a keyframe stream's run starts at page 1 for good, a
      non-keyframe's at page 0 (paged_cache "Placement").
    - paged form (any other page set: the window filling, with the special pages apart from the
      patch pages): k / v are the layer's whole
      pool [N, P, H, D], the visible pages in order in an int32 page table [1, 1, N, 1] (a fixed
      buffer; entries past the visible pages are never read). One graph per q length. cuDNN takes
      power-of-two page sizes only (`CuDNNFrontendKernel.paged_ok`); LingBot-Map's pages are one
      frame, 999 tokens at 518x378, so there such steps (the first ~70 frames) are exact
      (`paged_note` says why) and the steady state is dense.
    Exact (== SDPA to bf16 rounding), no host sync, but cuDNN's padding mask costs about what
    FlashInfer dense costs; plain cuDNN without a mask is faster but needs a graph per length
    (docs/benchmarks.md).
    Token-slot steps (compressed window, block-sparse layers), non-contiguous steps without the
    paged form, and failures go to the exact SDPA path (`error` keeps why a call failed, as
    `CuDNNBackend`; a failure is for good). Native bf16/fp16 stores only."""

    mode = "seqlen"
    _fixed_errors = (Exception,)     # the frontend rejected the graph or the call
    _fixed_takes_slots = False       # block-sparse layers attend exactly
    kernel = "cudnn-frontend"

    def __init__(self, cache, kernel=None, min_fill: float = 0.0):
        """kernel: the call (q, k, v, seq_q, seq_kv, table) -> out; default `CuDNNFrontendKernel`
        (tests pass a stand-in, which may run any dtype on any device)."""
        self.cache = cache
        pool = cache.pool
        self.min_fill = float(min_fill)
        self.capacity = pool.num_pages * pool.page_size
        self.error = None
        self.path = None
        self.calls = {"fixed": 0, "exact": 0}
        self.forms = {"dense": 0, "paged": 0}       # steps planned on each form
        self.paged = CuDNNFrontendKernel.paged_ok(pool.page_size)
        self.paged_note = None if self.paged else (
            f"page size {pool.page_size} is not a power of two: cuDNN's paged form cannot run; "
            f"non-contiguous steps attend exactly, contiguous ones dense")
        self._exact = SDPABackend.create(cache)
        self._fixed_ok = pool.kind == "native" and (
            kernel is not None or cache.attn_dtype in (torch.bfloat16, torch.float16))
        self._kernel = kernel
        if self._fixed_ok and kernel is None:
            try:
                self._kernel = CuDNNFrontendKernel(pool.device)
            except KVCacheError as exc:
                self._fixed_ok, self.error = False, str(exc)
        self._bias = None
        self._step_fixed = False
        self._step_view = None
        if self._fixed_ok:
            # keys past seq_kv in the last KV tile are loaded and given probability 0; zeroed
            # memory keeps 0 * garbage (NaN bit patterns) out of the output
            pool.k.zero_()
            pool.v.zero_()
            dev = pool.device
            self._seq_q = torch.zeros((1, 1, 1, 1), dtype=torch.int32, device=dev)
            self._seq_kv = torch.zeros((1, 1, 1, 1), dtype=torch.int32, device=dev)
            self._table = torch.zeros((1, 1, pool.num_pages, 1), dtype=torch.int32, device=dev)

    @classmethod
    def create(cls, cache):
        return cls(cache)               # not CuDNNBackend.create's choice of form

    def plan(self, step: StepTable) -> None:
        """Once per step: the path, the lengths and (paged) the page table, on the device."""
        self._step_fixed = False
        if not (self._fixed_ok and self.error is None and step.slots_t is None
                and step.num_kv_tokens >= self.min_fill * self.capacity):
            return
        if step.contiguous is not None:
            self._step_view = ("dense", step.contiguous[0])
        elif self.paged:
            self._table.view(-1)[:len(step.pages)].copy_(step.pages_t)     # int64 -> int32, on device
            self._step_view = ("paged", None)
        else:
            return
        self._step_fixed = True
        self._seq_q.fill_(step.q_tokens)
        self._seq_kv.fill_(step.num_kv_tokens)
        self.forms[self._step_view[0]] += 1

    def _attend_fixed(self, step: StepTable, q: torch.Tensor, layer: int, slots_t=None):
        pool = self.cache.pool
        form, first = self._step_view
        if form == "dense":
            H, D = pool.num_heads, pool.head_dim
            k = pool.k[layer, first:].view(-1, H, D)               # zero copy from the run's first page
            v = pool.v[layer, first:].view(-1, H, D)
            return self._kernel(q.contiguous(), k, v, self._seq_q, self._seq_kv, None)
        return self._kernel(q.contiguous(), pool.k[layer], pool.v[layer], self._seq_q, self._seq_kv, self._table)
