"""cuDNN attention backends over the paged KV cache (backend name ``cudnn``), beside SDPA and
FlashInfer in `engine.kv.backends` and through the same interface and page tables (this module
reads `StepTable`s; no bookkeeping of its own). CUDA, native bf16/fp16 stores.

PyTorch's cuDNN SDPA kernel over a FIXED key/value capacity -- each layer's whole
pool, read in place, the keys a step must not see hidden by an additive bias row built once per
step -- so cuDNN builds one graph for the whole run instead of one per visible length
(`CuDNNBackend`). Exact SDPA while the window fills. CUDA, native bf16/fp16 stores.
Measured slower than FlashInfer on the H200 (the bias takes cuDNN off its fast path). When the
cuDNN frontend imports (pip nvidia-cudnn-frontend), `CuDNNBackend.create` takes the
SEQUENCE-LENGTH form instead (`CuDNNSeqLenBackend`): the visible length as an int32 device
tensor (cuDNN's padding mask) over a fixed K/V view, dense from the visible run's first page
or through cuDNN's page table; one graph per q length (and first page), no mask, no host sync.
`frontend_error` says why the bias form ran.
Backend ``cudnn-split``: `CuDNNSplitBackend` -- in the steady state (one contiguous run)
the patch pages, whose length is constant from frame to frame, go through plain cuDNN without a
mask (one graph for the run) and the special tokens through flash, the two results merged
exactly by their log-sum-exp; every other step through FlashInfer (else SDPA).
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F

from .backends import FlashInferBackend, SDPABackend, _CacheRef, _flashinfer_dtype_ok, flashinfer_available
from .dtypes import FP8
from ..models import fused
from ..models.layers import CUDNN_Q_TILE, cudnn_one_wave
from .page_table import KVCacheError, StepTable


# ---------------------------------------------------------------------------------------- cuDNN
# Additive bias of a hidden key. Finite on purpose: a fixed-capacity call has whole KV tiles that
# are hidden (page 0 of a keyframe step, free pages), and an online softmax whose running max is
# still -inf computes exp(-inf - -inf) = NaN unless the kernel guards it; PyTorch's own bool-mask
# conversion for cuDNN uses -65504 for the same reason. exp(score - 65504) is exactly 0 in fp32
# for any score this model produces, so the result equals attention over the visible keys only.
CUDNN_MASKED = -65504.0


# Below this fraction of the capacity visible, `CuDNNBackend` attends the visible keys with the exact
# SDPA path instead (the window-filling phase: attending 80k keys for 10k visible would cost more
# than it saves). The sequence-length form skips the hidden tail, so its default is 0.
CUDNN_MIN_FILL = 0.5


def _cudnn_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q [1, H, n, D], k / v [1, H, capacity, D], bias [1, 1, 1 | n, capacity] -> [1, H, n, D] through
    PyTorch's cuDNN SDPA kernel ONLY: asked for alone, an ineligible call raises ("No available
    kernel") instead of silently running another kernel (with a priority list it would fall back)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


class CuDNNBackend(_CacheRef):
    """cuDNN attention over a FIXED key/value capacity: every layer's whole page pool, read in place.

    PyTorch builds (and caches) one cuDNN graph per shape *and stride* of q, k, v and the bias;
    the streamed visible length changes every frame (+6 special tokens) and with keyframe
    rollbacks, which made cuDNN lose end to end when called on the visible keys (graphs rebuilt for
    every new length: 129.9 vs 63.6 ms a frame with flash, H200). Here k / v are always the layer's
    whole pool viewed as
    ``[capacity, H, D]`` (capacity = num_pages * page_size; a zero-copy view, the same shape and
    strides for every layer and step), and the keys a step must not see -- free pages, page 0 of a
    keyframe step, the unused part of the last special page -- are hidden by an additive bias row
    (0 visible, `CUDNN_MASKED` hidden) built once per step from the step's page table (or token
    slots) on the device, with no host sync. So one graph serves the whole run (one per q length:
    the scale step and streamed steps) and the call is CUDA-graph capturable (static shapes,
    pointers and mask buffer). The visible pages need not be one run: any page set is exact.
    Measured on an H200 (docs/benchmarks.md): the mask takes cuDNN off its fast path (1.24 ms a
    layer against 0.85 ms for FlashInfer dense), so this stays an opt-in alternative.

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

    @classmethod
    def check_supports(cls, cache) -> None:
        if cache.pool.kind != "native":
            raise KVCacheError(f"the cuDNN attention backend reads the pool in place and needs a bf16/fp16 "
                               f"KV store, not {cache.pool.kind}; use backend 'flashinfer' (fp8) or 'sdpa'")

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


# ------------------------------------------------------------------ cuDNN through its frontend
@functools.lru_cache(maxsize=1)
def _import_cudnn_frontend():
    """The cuDNN frontend's Python package (`import cudnn`, pip nvidia-cudnn-frontend), or why not.
    torch is imported first, so the frontend finds the libcudnn PyTorch already loaded."""
    try:
        import cudnn
        cudnn.backend_version()               # raises when no libcudnn could be loaded
        return cudnn, None
    except Exception as exc:  # ImportError, or no / an unusable libcudnn
        return None, f"{type(exc).__name__}: {exc}"


def cudnn_frontend_available() -> bool:
    return _import_cudnn_frontend()[0] is not None


_CUDNN_UID = {"q": 1, "k": 2, "v": 3, "o": 4, "seq_q": 5, "seq_kv": 6, "k_table": 7, "v_table": 8}


def _build_plans(cudnn, g) -> int:
    """Validate a described frontend graph and build its execution plan (the heuristics' first:
    A, else the fallback). Returns the workspace bytes the built plan needs."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return int(g.get_workspace_size())


class CuDNNFrontendKernel:
    """cuDNN's fused attention built through the cuDNN frontend's graph API, with the padding mask:
    the visible lengths are DEVICE tensors (`seq_q`, `seq_kv`, int32 [1, 1, 1, 1]) read by the
    kernel, so one built graph serves every visible length -- no rebuild per frame, no host sync.

    `__call__(q, k, v, seq_q, seq_kv, table=None)`: q [n, H, D] contiguous; dense: k / v
    [S, H, D] views (token stride H * D), keys 0 .. seq_kv - 1 attended; paged: k / v [N, P, H, D]
    (the layer's pool), `table` int32 [1, 1, N, 1] the visible pages in order, the first seq_kv
    tokens of their concatenation attended. Returns [n, H, D]. Graphs are built once per layout
    (q length, K/V shape and strides, paged or not) and kept; `builds` counts them. cuDNN's
    "composite" SDPA implementation, the heuristics' first plan."""

    def __init__(self, device):
        cudnn, err = _import_cudnn_frontend()
        if cudnn is None:
            raise KVCacheError(f"the cuDNN frontend is not available ({err})")
        self._cudnn = cudnn
        self.device = torch.device(device)
        self._handle = None
        self._graphs: dict = {}
        self._workspace = torch.empty(0, dtype=torch.uint8, device=self.device)
        self.builds = 0

    def _dtype(self, dt):
        c = self._cudnn.data_type
        if dt == torch.bfloat16:
            return c.BFLOAT16
        if dt == torch.float16:
            return c.HALF
        raise KVCacheError(f"cuDNN attention runs bf16/fp16, not {dt}")

    @staticmethod
    def paged_ok(page_size: int) -> bool:
        """cuDNN's paged attention takes power-of-two block sizes only (CUDNN_STATUS_BAD_PARAM
        "block size needs to be non-zero and a power of 2", cuDNN 9.19 on the H200)."""
        return page_size > 0 and page_size & (page_size - 1) == 0

    def _build(self, q, k, table):
        cudnn = self._cudnn
        if self._handle is None:
            with torch.cuda.device(self.device):
                self._handle = cudnn.create_handle()
        n, H, D = q.shape
        io = self._dtype(q.dtype)
        g = cudnn.pygraph(handle=self._handle, name="reconstudio_sdpa", io_data_type=io,
                          intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
        qt = g.tensor(name="q", dim=[1, H, n, D], stride=[n * H * D, D, H * D, 1], data_type=io)
        if table is None:                       # [S, H, D] as cuDNN's [1, H, S, D]
            S = k.shape[0]
            kv_dim, kv_stride = [1, H, S, D], [S * k.stride(0), k.stride(1), k.stride(0), k.stride(2)]
        else:                                   # [N, P, H, D] pages as cuDNN's [N, H, P, D]
            N, P = k.shape[:2]
            kv_dim, kv_stride = [N, H, P, D], [k.stride(0), k.stride(2), k.stride(1), k.stride(3)]
        kt = g.tensor(name="k", dim=kv_dim, stride=kv_stride, data_type=io)
        vt = g.tensor(name="v", dim=kv_dim, stride=kv_stride, data_type=io)
        i32 = cudnn.data_type.INT32
        sq = g.tensor(name="seq_q", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)
        skv = g.tensor(name="seq_kv", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)
        extra = dict(use_padding_mask=True, seq_len_q=sq, seq_len_kv=skv)
        named = {"q": qt, "k": kt, "v": vt, "seq_q": sq, "seq_kv": skv}
        if table is not None:
            N = table.shape[2]
            for name in ("k_table", "v_table"):
                named[name] = g.tensor(name=name, dim=[1, 1, N, 1], stride=[N, 1, 1, 1], data_type=i32)
            extra.update(paged_attention_k_table=named["k_table"], paged_attention_v_table=named["v_table"],
                         paged_attention_max_seq_len_kv=N * k.shape[1])
        o, _ = g.sdpa(name="sdpa", q=qt, k=kt, v=vt, attn_scale=1.0 / math.sqrt(D), generate_stats=False,
                      implementation=cudnn.attention_implementation.COMPOSITE,
                      compute_data_type=cudnn.data_type.FLOAT, **extra)
        o.set_output(True).set_dim([1, H, n, D]).set_stride([n * H * D, D, H * D, 1]).set_data_type(io)
        named["o"] = o
        for name, t in named.items():
            t.set_uid(_CUDNN_UID[name])
        ws = _build_plans(cudnn, g)
        if ws > self._workspace.numel():
            self._workspace = torch.empty(ws, dtype=torch.uint8, device=self.device)
        self.builds += 1
        return g

    def __call__(self, q, k, v, seq_q, seq_kv, table=None):
        key = (tuple(q.shape), q.dtype, tuple(k.shape), k.stride(), v.stride(), table is not None)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = self._build(q, k, table)
        out = torch.empty_like(q)
        ptrs = {_CUDNN_UID["q"]: q.data_ptr(), _CUDNN_UID["k"]: k.data_ptr(), _CUDNN_UID["v"]: v.data_ptr(),
                _CUDNN_UID["o"]: out.data_ptr(), _CUDNN_UID["seq_q"]: seq_q.data_ptr(),
                _CUDNN_UID["seq_kv"]: seq_kv.data_ptr()}
        if table is not None:
            ptrs[_CUDNN_UID["k_table"]] = ptrs[_CUDNN_UID["v_table"]] = table.data_ptr()
        self._cudnn.set_stream(self._handle, torch.cuda.current_stream(self.device).cuda_stream)
        g._execute(ptrs, self._workspace.data_ptr(), self._handle)
        return out


class CuDNNSeqLenBackend(CuDNNBackend):
    """cuDNN attention with the visible length as a SEQUENCE LENGTH (cuDNN's padding mask) over a
    fixed-capacity K/V view, through the cuDNN frontend (`CuDNNFrontendKernel`): backend "cudnn"
    when the frontend imports (`CuDNNBackend.create`).

    PyTorch exposes cuDNN SDPA for dense inputs only without a length (a graph rebuilt per visible
    length, 40 ms) or with a bias mask (off cuDNN's fast path: 1.16-1.24 against 0.63 ms a layer
    on the H200, docs/benchmarks.md). Here the length is an int32 device tensor the kernel reads,
    written once per step by `plan` (`fill_`, no host sync), and the keys past it are skipped
    whole tiles at a time, so the call costs what the visible keys cost and one graph serves the
    run:
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
    Measured on the H200 (docs/benchmarks.md): exact (== SDPA to bf16 rounding), no host sync,
    but cuDNN's padding mask costs what FlashInfer dense costs (0.86 vs 0.85 ms a layer; plain
    cuDNN without a mask 0.63 ms needs a graph per length).
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
        return cls(cache)

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


# ------------------------------------------------------------------ cuDNN split: fixed part + rest
def _bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)              # [L, H, D] -> [1, H, L, D] (a view)


def torch_cudnn_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """PyTorch's cuDNN SDPA (no mask) over exactly k / v [S, H, D] -> (out [n, H, D], lse [H, n]
    float32, natural log). PyTorch keys its cuDNN graph cache by shapes and strides: a fixed-length
    K/V run costs one build for good."""
    n, H, _ = q.shape
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(_bhsd(q), _bhsd(k), _bhsd(v), None, True)
    return res[0][0].transpose(0, 1), res[1].reshape(H, -1)[:, :n].float()


def torch_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's cuDNN SDPA (no mask, no log-sum-exp: its fastest form, ~0.1 ms a layer below the
    form with statistics on the H200) over exactly k / v [S, H, D] -> out [n, H, D]."""
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(_bhsd(q), _bhsd(k), _bhsd(v), None, False)
    return res[0][0].transpose(0, 1)


def torch_flash_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """PyTorch's flash attention (no per-shape set-up: any K/V length) over k / v [S, H, D] ->
    (out [n, H, D], lse [H, n] float32, natural log). On the CPU its CPU flash kernel (tests)."""
    n, H, _ = q.shape
    if q.device.type == "cuda":
        res = torch.ops.aten._scaled_dot_product_flash_attention(_bhsd(q), _bhsd(k), _bhsd(v))
    else:
        res = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(_bhsd(q), _bhsd(k), _bhsd(v))
    return res[0][0].transpose(0, 1), res[1].reshape(H, -1)[:, :n].float()


def torch_flash_varlen_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                           cu_k: torch.Tensor):
    """PyTorch's flash attention (varlen) of q [n, H, D] over the FIRST cu_k[1] keys of the fixed
    view k / v [cap, H, D] -> (out [n, H, D], lse [H, n] float32). The length is read by the kernel
    from the int32 device tensor cu_k = [0, length] (cu_q = [0, n]), so nothing depends on it on
    the host: one CUDA graph serves every length (the split's static steps)."""
    n, H, _ = q.shape
    res = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, n, k.shape[0], 0.0, False, False)
    return res[0], res[1].reshape(H, -1)[:, :n].float()


def tail_chunks(tail_rows: int, heads: int, sms: Optional[int], keys: int, tile: int = CUDNN_Q_TILE,
                min_keys: int = 1024) -> int:
    """How many key chunks the wave tail's queries are attended in (`chunked_lse`): enough that
    chunks x heads x ceil(rows / tile) work tiles fill the SMs once, each chunk >= `min_keys`."""
    tiles = heads * -(-tail_rows // tile)
    n = max(1, min((sms or tiles) // tiles, keys // min_keys))
    return -(-keys // -(-keys // n))       # runs of ceil(keys / n): none of them empty


def even_chunks(keys: int, most: int, min_keys: int = 1024) -> int:
    """The largest chunk count <= `most` that cuts `keys` into EQUAL runs of >= `min_keys` (what
    `chunked_lse`'s cuDNN form needs: the chunks as one strided batch view); 1 if none."""
    return max([n for n in range(1, max(1, most) + 1) if keys % n == 0 and keys // n >= min_keys] or [1])


def chunked_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunks: int, bounds=None,
                kernel: str = "flash"):
    """Attention of a few query rows q [t, H, D] over MANY keys k / v [L, H, D] -> (out, lse [H, t]
    float32), the keys cut into `chunks` contiguous runs attended in parallel and merged by their
    log-sum-exp. Why: t rows are one work tile a head, so a single call would run `heads` CTAs
    through all L keys one after another (the wave tail of `CuDNNSplitBackend`); chunked, the same
    work spreads over chunks x heads CTAs. On CUDA one varlen flash call (the q rows repeated per
    chunk, the chunks zero-copy slices of k / v, `bounds` = (cu_q, cu_k) int32 device tensors from
    `chunk_bounds`), or with kernel "cudnn" one batched cuDNN call (equal chunks, `even_chunks`:
    the batch a strided view of k / v); elsewhere a loop of `torch_flash_lse` (the CPU tests)."""
    t, H, D = q.shape
    L = k.shape[0]
    c = -(-L // chunks)                                                    # keys a chunk (the last: fewer)
    assert (chunks - 1) * c < L, "an empty key chunk (tail_chunks picks the count)"
    if q.device.type == "cuda" and kernel == "cudnn":
        assert L % chunks == 0, "the cuDNN form takes equal chunks (even_chunks picks the count)"
        kc, vc = (x.view(chunks, L // chunks, H, D).transpose(1, 2) for x in (k, v))   # [C, H, c, D]
        qc = q.repeat(chunks, 1, 1).view(chunks, t, H, D).transpose(1, 2)
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(qc, kc, vc, None, True)
        out = res[0].transpose(1, 2)                                       # [chunks, t, H, D]
        lse = res[1].reshape(chunks, H, -1)[:, :, :t].float()
    elif q.device.type == "cuda":
        cu_q, cu_k = bounds if bounds is not None else chunk_bounds(t, L, chunks, q.device)
        res = torch.ops.aten._flash_attention_forward(q.repeat(chunks, 1, 1), k, v, cu_q, cu_k, t, c,
                                                      0.0, False, False)
        out = res[0].view(chunks, t, H, -1)
        lse = res[1]
        # PyTorch's varlen flash returns the statistics unpadded [H, chunks * t] (or padded
        # [chunks, H, >= t] in older flash builds): both read as [chunks, H, t]
        lse = (lse.view(H, chunks, t).transpose(0, 1) if lse.dim() == 2 else lse[:, :, :t]).float()
    else:
        parts = [torch_flash_lse(q, k[i * c:(i + 1) * c], v[i * c:(i + 1) * c]) for i in range(chunks)]
        out = torch.stack([o for o, _ in parts])                           # [chunks, t, H, D]
        lse = torch.stack([s for _, s in parts])                           # [chunks, H, t]
    total = torch.logsumexp(lse, dim=0)                                    # [H, t]
    w = torch.exp(lse - total).transpose(1, 2).unsqueeze(-1)               # [chunks, t, H, 1]
    return (out.float() * w).sum(dim=0).to(q.dtype), total


def chunk_bounds(rows: int, keys: int, chunks: int, device):
    """(cu_q, cu_k) int32 device tensors of `chunked_lse`'s varlen call: `chunks` copies of `rows`
    query rows, and `keys` cut into runs of ceil(keys / chunks) (the last one shorter). Built by
    device kernels only (no host copy: safe while a CUDA graph captures)."""
    i = torch.arange(chunks + 1, device=device, dtype=torch.int32)
    c = -(-keys // chunks)
    return i * rows, torch.clamp(i * c, max=keys)


def masked_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor):
    """`torch_flash_varlen_lse` in plain float32 math (the CPU and tests): the keys at or past
    cu_k[1] masked on the device, no host read of the length."""
    qf, kf, vf = (x.float().transpose(0, 1) for x in (q, k, v))                  # [H, ., D]
    s = (qf @ kf.transpose(1, 2)) * q.shape[-1] ** -0.5
    hidden = torch.arange(k.shape[0], device=k.device) >= cu_k[1]
    s = s.masked_fill(hidden, float("-inf"))
    # the slots past the length are unwritten pool memory: a NaN there would survive 0 * NaN
    vf = vf.masked_fill(hidden[None, :, None], 0.0)
    lse = torch.logsumexp(s, dim=-1)                                               # [H, n]
    out = torch.softmax(s, dim=-1) @ vf
    return out.transpose(0, 1).to(q.dtype), lse


def merge_lse(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each set's result and log-sum-exp:
    (out_a e^lse_a + out_b e^lse_b) / (e^lse_a + e^lse_b) = out_a + (out_b - out_a) sigmoid(lse_b - lse_a),
    in float32, cast back to out_a's dtype. Exact up to rounding; out_* [n, H, D], lse_* [H, n]."""
    if fused.merge_usable(out_a, lse_a):
        out = fused.merge_lse(out_a, lse_a, out_b, lse_b)              # one Triton pass on CUDA
        if out is not None:
            return out
    w = torch.sigmoid(lse_b - lse_a).t().unsqueeze(-1)                 # [n, H, 1]
    return torch.lerp(out_a.float(), out_b.float(), w).to(out_a.dtype)


class CuDNNSplitBackend(_CacheRef):
    """The steady-state global attention split into a FIXED-length part, attended by plain cuDNN
    (no mask: its fast path, 0.63 ms against FlashInfer's 0.85 at 73,728 keys on the H200) through
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
    Measured on the H200 at 78,078 keys: 0.756 ms a layer (FlashInfer 0.908, the split's parts
    ~0.89); whole model after the cap 27.8 FPS against 22.9 with the split (docs/benchmarks.md
    "Fixed-length steps").
    Every other step -- the window filling (special pages apart from the patch pages), token slots
    (compressed window, block-sparse layers), a run not laid out as above, an A length beyond
    `max_shapes` distinct ones (a graph each) -- and every call after a kernel failure (`error`)
    go to the fallback backend: FlashInfer (dense / paged) where it runs, else SDPA.
    Native bf16/fp16 stores, and fp8 stores attended in bf16/fp16 (the run read into 16-bit
    scratch: e4m3 -> bf16 is exact); int8 always falls back.
    `static` (set for whole-step CUDA graphs): part B attends the fixed special zone with its
    length read on the device, so a split step's kernels and buffers depend only on its kind
    (`static_key`); the model then replays each streamed step as one graph.
    Measurements: docs/benchmarks.md "cuDNN split"."""

    name = "cudnn"
    mode = "split"
    frontend_error = None

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
        self.calls = {"split": 0, "whole": 0, "fallback": 0}
        self.a_shapes: set = set()                 # (q tokens, A pages) handed to the fixed kernel
        self.whole_shapes: set = set()             # (q tokens, K/V tokens) attended whole
        self.whole = bool(whole)
        self.fp8 = pool.kind == "fp8"              # read into 16-bit scratch (above)
        self._scratch = None                       # (k, v) 16-bit scratch of an fp8 store
        attn16 = cache.attn_dtype in (torch.bfloat16, torch.float16)
        self._ok = pool.kind in ("native", "fp8") and (kernel_a is not None or attn16)
        self._kernel_a = kernel_a or torch_cudnn_lse
        self._kernel_b = kernel_b or torch_flash_lse
        if kernel_full is None and not cuda:
            self.whole = False           # no cuDNN off the GPU (CPU tests pass a stand-in)
        self._kernel_full = kernel_full or torch_cudnn
        self.kernel = "cudnn-split (cuDNN + flash, merged by log-sum-exp)"
        if self.fp8:
            self.kernel = "cudnn-split fp8 store (cuDNN + flash on 16-bit scratch, merged by log-sum-exp)"
        if fallback is None:
            ok = cuda and _flashinfer_dtype_ok(cache.precision) and flashinfer_available() and pool.kind != "int8"
            fallback = FlashInferBackend.create(cache) if ok else SDPABackend.create(cache)
        self._fallback = fallback
        self._split = None          # (first page, A pages, B tokens, whole) of the step, or None
        # Static steps (set by the session for whole-step CUDA graphs, engine/lingbot/model.py):
        # part B attends a FIXED view -- the special zone, from the end of the patch run to the
        # end of the pool -- whose visible length is an int32 device tensor written in `plan`, so
        # a split step's shapes and pointers depend only on its kind (`static_key`).
        self.static = False
        self._kernel_b_static = kernel_b_static or (torch_flash_varlen_lse if cuda else masked_lse)
        self._cu_q = self._cu_k = None      # int32 [2] device tensors [0, q tokens], [0, B tokens]

    @classmethod
    def create(cls, cache):
        return cls(cache)

    @classmethod
    def check_supports(cls, cache) -> None:
        return None          # every other store goes to the fallback

    def split_point(self, step: StepTable):
        """(first page, A pages, B tokens) when the step has the layout above, else None."""
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
        return first, n_a, b

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
        if split is not None:
            whole = self.whole and step.fixed_length
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
        if split is None:
            self._fallback.plan(step)
        elif self.static and not split[3]:
            if self._cu_q is None:
                self._cu_q = torch.zeros(2, dtype=torch.int32, device=self.cache.device)
                self._cu_k = torch.zeros(2, dtype=torch.int32, device=self.cache.device)
            self._cu_q[1:].fill_(step.q_tokens)      # kernels with the values as arguments:
            self._cu_k[1:].fill_(split[2])           # no host sync, stream-ordered

    def static_key(self):
        """For a planned step attended with fixed shapes and pointers (`static`, split or whole):
        a key that is equal exactly when two steps launch the same kernels on the same buffers --
        what a whole-step CUDA graph can be keyed by; None otherwise (fallback steps, `static`
        off, after an error)."""
        if not self.static or self._split is None or self.error is not None:
            return None
        first, n_a, b, whole = self._split
        if whole:
            return ("whole", first, n_a * self.cache.pool.page_size + b)
        return ("split", first, n_a)

    def attend(self, step: StepTable, q: torch.Tensor, layer: int, slots_t=None):
        if self._split is not None and slots_t is None and self.error is None:
            try:
                out = self._attend_split(q, layer)
            except Exception as exc:   # a kernel rejected the call: the fallback from now on
                self.error = f"{type(exc).__name__}: {exc}"[:500]
                self._split = None
                self._fallback.plan(step)
            else:
                self.path = "whole" if self._split[3] else "split"
                self.calls[self.path] += 1
                return out
        self.path = "fallback"
        self.calls["fallback"] += 1
        return self._fallback.attend(step, q, layer, slots_t=slots_t)

    def _attend_split(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        pool = self.cache.pool
        first, n_a, b, whole = self._split
        P, H, D = pool.page_size, pool.num_heads, pool.head_dim
        q = q.contiguous()
        n = n_a * P + b
        m = -(-n // P)
        static_b = self.static and not whole
        if static_b:                   # the run to the end of the pool: B's view is fixed
            m = pool.num_pages - first
        full, part_a, part_b = self._kernel_full, self._kernel_a, self._kernel_b
        kp, vp = self._run_views(layer, first, m)       # zero copy (e4m3 for an fp8 store)
        if self.fp8:                   # the run as 16-bit scratch; key scales into q
            kp, vp = self._converted(kp, vp)
            ks, vs = pool.scales[layer, 0], pool.scales[layer, 1]
            q = (q.float() * ks.view(1, H, 1)).to(q.dtype)
        if whole:                      # one fixed-length run: no statistics, no merge
            out = self._wave_tail(q, kp[:n], vp[:n], lambda *a: (full(*a), None))[0]
        else:
            out, lse_a = self._wave_tail(q, kp[:n_a * P], vp[:n_a * P], part_a)   # constant shape
            if static_b or b:          # static: B's length from the device (cu_k), not the host
                out_b, lse_b = (self._kernel_b_static(q, kp[n_a * P:], vp[n_a * P:], self._cu_q, self._cu_k)
                                if static_b else part_b(q, kp[n_a * P:n], vp[n_a * P:n]))
                out = merge_lse(out, lse_a, out_b, lse_b)
        if self.fp8:                   # attention is linear in V: the value scales last
            out = (out.float() * vs.view(1, H, 1)).to(q.dtype)
        return out

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

    def _run_views(self, layer: int, first: int, m: int):
        """The layer's keys / values of pages first .. first + m - 1 as [m * page_size, H, D] views
        of the pool (read as e4m3 for an fp8 store)."""
        pool = self.cache.pool
        k, v = pool.k[layer, first:first + m], pool.v[layer, first:first + m]
        if self.fp8:
            k, v = k.view(FP8), v.view(FP8)
        shape = (m * pool.page_size, pool.num_heads, pool.head_dim)
        return k.view(shape), v.view(shape)

    def _converted(self, k8: torch.Tensor, v8: torch.Tensor):
        """e4m3 run views read into the 16-bit scratch pair as stored (e4m3 -> bf16/fp16 is
        exact), same-shaped views. The scratch holds the pool's capacity and is allocated once
        (one layer at a time uses it)."""
        pool = self.cache.pool
        if self._scratch is None:
            shape = (pool.num_pages * pool.page_size, pool.num_heads, pool.head_dim)
            self._scratch = tuple(torch.empty(shape, dtype=self.cache.attn_dtype, device=pool.device)
                                  for _ in range(2))
        n = k8.shape[0]
        sk, sv = (x[:n] for x in self._scratch)
        sk.copy_(k8)
        sv.copy_(v8)
        return sk, sv
