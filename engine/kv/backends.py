"""The SDPA and FlashInfer attention backends over the paged KV cache. They read the tables
`PagedKVCache.begin_step` builds once per step and the pool (`cache.pool`); neither keeps its own
bookkeeping. Each declares what it supports (`support`, engine/kv/attention.py); the choice
between backends is made from those declarations in engine/kv/resolve.py, which imports the
backend modules (none of them imports it: no import cycle).

Interface (engine/kv/attention.py): `create(cache)`, `plan(step)` once per step,
`attend(step, q, layer, slots_t=None)` with q [n, H, D] already in the attention dtype; `slots_t`
= explicit visible flat slots of this layer (block-sparse attention). A compressed window or an
int8 store gives token slots (`step.slots_t`), which both backends read (FlashInfer as pages of
one token).

* ``sdpa``: `torch.nn.functional.scaled_dot_product_attention` with no mask over the visible
  tokens. When the visible pages are one contiguous run (the steady state of a keyframe stream,
  see paged_cache "Placement") it attends to a zero-copy view of the pool; otherwise it gathers
  the visible pages into a buffer allocated once. Works on CPU and any GPU, in every dtype.
  On CUDA it asks for the flash kernel first: PyTorch's default pick there (cuDNN) rebuilds a
  graph for every new KV length, which costs more CPU time than the kernel saves (see `create`).
* ``flashinfer``: FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` (NHD layout, the
  ``(k_pool, v_pool)`` pair of one layer, causal=False), planned once per step and run per
  layer; workspace allocated once. On Hopper its FA3 kernels are asked for by name
  (`flashinfer_kernel`). When the visible pages are one contiguous run (the steady state, see
  paged_cache "Placement") and the store is 16-bit, the step is planned on the ragged wrapper
  instead and each layer attends to a zero-copy ``[tokens, H, D]`` view of the pool ("dense"
  path); the paged kernel covers every other case. A plan waits for
  the previous plan's host->device copy when its lengths differ (`_guard_plan`), so the host
  may run ahead of the GPU. CUDA and bf16/fp16 only (FlashInfer has no fp32 kernels, and
  storing an fp32 cache in bf16 behind the user's back is exactly what we must not do). int8
  stores are SDPA only. An fp8 store runs FlashInfer's fp8-KV kernel:
  FA2 with q in the compute dtype and e4m3 K/V, dequantised in registers; the per-head scales
  are folded into q (keys) and the output (values). It must be FA2: FlashInfer 0.6.1 picks FA3
  on Hopper, whose wgmma has no bf16 x e4m3 operation, so that JIT build stops at cute's "No
  eligible GMMA operator" (the failure in docs/benchmarks_kv.md).
The cuDNN backends: engine/kv/cudnn.py (``cudnn``) and engine/kv/cudnn_split.py
(``cudnn-split``); what ``auto`` takes: engine/kv/resolve.py.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import torch
import torch.nn.functional as F

from .attention import STORES, Backend, Support
from .dtypes import FP8
from .page_table import KVCacheError, StepTable

_FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024
_FLASHINFER_FA3_WORKSPACE_BYTES = 8 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def _import_flashinfer():
    try:
        import flashinfer  # noqa: F401
        return flashinfer, None
    except Exception as exc:  # ImportError, or a broken CUDA/JIT environment
        return None, f"{type(exc).__name__}: {exc}"


def flashinfer_available() -> bool:
    return _import_flashinfer()[0] is not None


def flashinfer_kernel(device: Any) -> str:
    """FlashInfer kernel family for 16-bit stores on `device`: "fa3" (its Hopper kernels: wgmma,
    TMA) on compute capability 9.x with CUDA >= 12.3, else "fa2". Named here rather than left to
    FlashInfer's "auto" (which makes the same choice) so that stats and benchmarks can say which
    kernel ran."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return "fa2"
    major, _ = torch.cuda.get_device_capability(dev)
    cuda = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    return "fa3" if major == 9 and cuda >= (12, 3) else "fa2"


class SDPABackend(Backend):
    """Gather (or zero-copy view) + one dense SDPA call per layer."""

    name = "sdpa"
    support = Support(devices=("cpu", "cuda"), compute_dtypes=(torch.float32, torch.bfloat16, torch.float16,
                                                               torch.float64),
                      stores=STORES, auto_stores=STORES, note="every store, layout and device: the fallback")

    def __init__(self, cache, zero_copy: bool = True, kernels=None):
        """kernels: optional list of torch.nn.attention.SDPBackend in priority order."""
        self.cache = cache
        self.zero_copy = zero_copy
        self._buf_k = self._buf_v = None
        self.kernels = kernels

    @classmethod
    def create(cls, cache):
        kernels = None
        if torch.device(cache.device).type == "cuda":
            # PyTorch's default pick on Hopper is cuDNN, which builds a new graph (CPU time) for
            # every new KV length -- and the special stream grows by 6 tokens a frame. The flash
            # kernel has no per-shape set-up.
            from torch.nn.attention import SDPBackend
            kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        return cls(cache, kernels=kernels)

    def plan(self, step: StepTable) -> None:
        return None

    def visible_kv(self, step: StepTable, layer: int, slots_t=None):
        """The visible keys/values of one layer as [tokens, H, D] in the attention dtype (a view
        of the pool when contiguous; see KVPool.visible)."""
        return self.cache.pool.visible(layer, step, zero_copy=self.zero_copy, slots_t=slots_t)

    def attend(self, step: StepTable, q: torch.Tensor, layer: int, slots_t=None):
        k, v = self.visible_kv(step, layer, slots_t)
        qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, L, D]
        if self.kernels is not None:
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel(self.kernels, set_priority=True):
                out = F.scaled_dot_product_attention(qh, kh, vh)
        else:
            out = F.scaled_dot_product_attention(qh, kh, vh)
        return out[0].transpose(0, 1)


class FlashInferBackend(Backend):
    """FlashInfer paged prefill over the same page tables (plan once per step, run per layer)."""

    name = "flashinfer"
    # no fp32 kernels (storing an fp32 cache in bf16 behind the user's back is not an option);
    # int8 stores have no FlashInfer path
    support = Support(devices=("cuda",), compute_dtypes=(torch.bfloat16, torch.float16), stores=("native", "fp8"),
                      requires=("flashinfer",), auto_stores=("native", "fp8"))

    @classmethod
    def unavailable(cls) -> Optional[str]:
        mod, err = _import_flashinfer()
        return None if mod is not None else f"{err}; install flashinfer-python"

    def __init__(self, cache, dense: bool = True, kernel: Optional[str] = None):
        """dense: attend a contiguous visible run through the ragged kernel (below); False = the
        paged kernel always (comparisons). kernel: "fa2" | "fa3" (default `flashinfer_kernel`;
        an fp8 store always runs FA2, see the module docstring)."""
        flashinfer, err = _import_flashinfer()
        if flashinfer is None:
            raise KVCacheError(f"FlashInfer is not available ({err})")
        self.cache = cache
        self._fp8 = cache.pool.kind == "fp8"
        if self._fp8:   # see the module docstring: 16-bit q x e4m3 KV exists only in FA2
            kind = "fa2"
        else:
            kind = kernel or flashinfer_kernel(cache.device)
        self.kernel = kind
        # FA2 splits long KV sets and merges the parts in this float workspace; FlashInfer 0.6.1's
        # FA3 (sm90) plan and kernels never touch it (its scheduler only fills the int workspace),
        # so a 16-bit FA3 cache keeps a token buffer instead of 128 MiB
        ws = _FLASHINFER_FA3_WORKSPACE_BYTES if kind == "fa3" and not self._fp8 else _FLASHINFER_WORKSPACE_BYTES
        self._workspace = torch.empty(ws, dtype=torch.uint8, device=cache.device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", backend=kind)
        # dense path: FlashInfer's ragged wrapper over the one contiguous run of pages (same JIT
        # module as the paged kernel; K/V tiles loaded whole by TMA instead of row by row through
        # the page table). Native 16-bit stores; FA2 fp8-KV stays paged.
        self.dense = bool(dense)
        self._ragged = None
        self.dense_error = None
        if self.dense and not self._fp8:
            self._ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD", backend=kind)
        self.path = None              # "dense" | "paged": what the last plan set up
        self._dense_view = None       # (first_page, num_pages, num_kv_tokens) of a dense plan
        self._token_pages = False
        self._plan_key = None         # what the last plan's host-side schedule depends on
        self._plan_event = None       # CUDA event after the last plan's copies (see _guard_plan)
        self.plans = 0                # plan() calls (tests: once per step, not per layer)

    @classmethod
    def create(cls, cache):
        return cls(cache)

    def plan(self, step: StepTable, slots_t=None) -> None:
        """Once per step (PagedKVCache.begin_step), shared by all layers; block-sparse steps plan
        again per layer with that layer's token list (`attend(..., slots_t=)`)."""
        c = self.cache
        i32 = torch.int32
        slots_t = step.slots_t if slots_t is None else slots_t
        kv_dt = FP8 if c.pool.kind == "fp8" else c.dtype
        q_dt = c.attn_dtype
        self.plans += 1
        if self._ragged is not None and slots_t is None and step.contiguous is not None:
            n = step.num_kv_tokens
            self._guard_plan(("dense", step.q_tokens, n))
            try:
                self._ragged.plan(torch.tensor([0, step.q_tokens], dtype=i32), torch.tensor([0, n], dtype=i32),
                                  c.num_heads, c.num_heads, c.head_dim, causal=False,
                                  q_data_type=q_dt, kv_data_type=kv_dt, o_data_type=c.attn_dtype)
            except Exception as exc:     # e.g. a FlashInfer build without the ragged kernel: go paged
                self._ragged = None
                self.dense_error = f"{type(exc).__name__}: {exc}"
            else:
                self.path, self._dense_view = "dense", (*step.contiguous, n)
                self._token_pages = False
                self._record_plan()
                return
        if slots_t is not None:      # token lists: pages of one token over the same pool
            pages_t, n, page, last = slots_t.to(i32), slots_t.numel(), 1, 1
        else:
            pages_t, n, page, last = step.pages_t.to(i32), len(step.pages), c.page_size, step.last_page_len
        self._guard_plan(("paged", step.q_tokens, n, page, last))
        self._wrapper.plan(
            torch.tensor([0, step.q_tokens], dtype=i32),
            torch.tensor([0, n], dtype=i32),
            pages_t,
            torch.tensor([last], dtype=i32),
            c.num_heads, c.num_heads, c.head_dim, page,
            causal=False, q_data_type=q_dt, kv_data_type=kv_dt,
            o_data_type=c.attn_dtype,
        )
        self.path, self._dense_view = "paged", None
        self._token_pages = slots_t is not None
        self._record_plan()

    def _guard_plan(self, key: tuple) -> None:
        """A FlashInfer plan writes its schedule into ONE page-locked host buffer per wrapper and
        queues a copy of it to the device; a second plan with different lengths would overwrite
        that buffer before the first copy ran if the host is ahead of the GPU (no sync per frame).
        So wait for the previous plan's copy first -- normally long done, as the host runs at
        most about a step ahead. Equal lengths write identical bytes: no wait (block-sparse
        plans every layer with the same lengths)."""
        if key != self._plan_key and self._plan_event is not None:
            self._plan_event.synchronize()
        self._plan_key = key

    def _record_plan(self) -> None:
        dev = torch.device(self.cache.device)
        if dev.type == "cuda":
            if self._plan_event is None:
                self._plan_event = torch.cuda.Event()
            self._plan_event.record(torch.cuda.current_stream(dev))

    def attend(self, step: StepTable, q: torch.Tensor, layer: int, slots_t=None):
        pool = self.cache.pool
        if slots_t is not None:      # block-sparse: this layer's own token list
            self.plan(step, slots_t)
        elif self.path == "dense":   # one contiguous run of pages: a plain [tokens, H, D] view
            a, m, n = self._dense_view
            P, H, D = pool.page_size, pool.num_heads, pool.head_dim
            k = pool.k[layer, a:a + m].view(m * P, H, D)[:n]
            v = pool.v[layer, a:a + m].view(m * P, H, D)[:n]
            return self._ragged.run(q.contiguous(), k, v)
        k, v = pool.k[layer], pool.v[layer]
        if pool.kind == "fp8":
            k, v = k.view(FP8), v.view(FP8)
        if self._token_pages:
            N, P, H, D = k.shape
            k, v = k.view(N * P, 1, H, D), v.view(N * P, 1, H, D)
        if pool.kind == "fp8":
            ks, vs = pool.scales[layer, 0], pool.scales[layer, 1]
            # FA2: per-head scales folded in -- keys into q, values into the output
            out = self._wrapper.run((q.float() * ks[:, None]).to(q.dtype).contiguous(), (k, v))
            return (out.float() * vs[:, None]).to(q.dtype)
        return self._wrapper.run(q.contiguous(), (k, v))
