"""Attention backends over the paged KV cache. Both read the tables `PagedKVCache.begin_step`
builds once per step; neither keeps its own bookkeeping.

* ``sdpa``: `torch.nn.functional.scaled_dot_product_attention` with no mask over the visible
  tokens. When the visible pages are one contiguous run (the steady state of a keyframe stream,
  see paged_cache "Placement") it attends to a zero-copy view of the pool; otherwise it gathers
  the visible pages into a buffer allocated once. Works on CPU and any GPU, in every dtype.
  On CUDA it asks for the flash kernel first: PyTorch's default pick there (cuDNN) rebuilds a
  graph for every new KV length, which costs more CPU time than the kernel saves (see `create`).
* ``flashinfer``: FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` (NHD layout, the
  ``(k_pool, v_pool)`` pair of one layer, causal=False), planned once per step and run per
  layer; workspace allocated once. CUDA and bf16/fp16 only (FlashInfer has no fp32 kernels, and
  storing an fp32 cache in bf16 behind the user's back is exactly what we must not do).
* ``auto``: flashinfer when it imports, the device is CUDA and the dtype is bf16/fp16; else sdpa.
"""
from __future__ import annotations

import functools
import os
import weakref
from typing import Any

import torch
import torch.nn.functional as F

from .paged_cache import KVCacheError, StepTable

_FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024


@functools.lru_cache(maxsize=1)
def _import_flashinfer():
    try:
        import flashinfer  # noqa: F401
        return flashinfer, None
    except Exception as exc:  # ImportError, or a broken CUDA/JIT environment
        return None, f"{type(exc).__name__}: {exc}"


def flashinfer_available() -> bool:
    return _import_flashinfer()[0] is not None


def available_backends(device: Any = "cpu", dtype: Any = None) -> list[str]:
    """Backends usable on `device` (for the settings panel / CLI help)."""
    out = ["auto", "sdpa"]
    dev = torch.device(device)
    if dev.type == "cuda" and flashinfer_available():
        if dtype is None or _canon(dtype) in (torch.bfloat16, torch.float16):
            out.append("flashinfer")
    return out


def _canon(dtype: Any) -> torch.dtype:
    from .paged_cache import parse_dtype
    return parse_dtype(dtype)


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype):
    """Backend factory for a cache on `device` storing `dtype`; clear errors for impossible picks."""
    name = (name or "auto").lower()
    device = torch.device(device)
    fi_ok_dtype = dtype in (torch.bfloat16, torch.float16)
    if name == "auto":
        if device.type == "cuda" and fi_ok_dtype and flashinfer_available():
            return FlashInferBackend
        return SDPABackend
    if name == "sdpa":
        return SDPABackend
    if name == "flashinfer":
        if device.type != "cuda":
            raise KVCacheError("the FlashInfer attention backend needs a CUDA device; use backend "
                               "'sdpa' (or 'auto') on the CPU")
        if not fi_ok_dtype:
            raise KVCacheError(f"the FlashInfer attention backend supports bf16 and fp16 only, not "
                               f"{str(dtype).replace('torch.', '')}; choose dtype bf16/fp16 or backend 'sdpa'")
        mod, err = _import_flashinfer()
        if mod is None:
            raise KVCacheError(f"the FlashInfer attention backend is not available ({err}); install "
                               f"flashinfer-python or use backend 'sdpa'")
        return FlashInferBackend
    raise KVCacheError(f"unknown attention backend {name!r}; use auto, sdpa or flashinfer")


class _CacheRef:
    """A backend reaches its cache through a weak reference: the cache owns the backend, so a
    strong link back would make a cycle, and a closed session's KV pools (GiBs on the GPU) would
    stay allocated until Python's cycle collector happened to run."""

    @property
    def cache(self):
        c = self._cache_ref()
        if c is None:
            raise KVCacheError("KV cache backend used after its cache was freed")
        return c

    @cache.setter
    def cache(self, cache):
        self._cache_ref = weakref.ref(cache)


class SDPABackend(_CacheRef):
    """Gather (or zero-copy view) + one dense SDPA call per layer."""

    name = "sdpa"

    def __init__(self, cache, zero_copy: bool = True, kernels=None):
        """kernels: optional list of torch.nn.attention.SDPBackend in priority order."""
        self.cache = cache
        self.zero_copy = zero_copy
        self._buf_k = self._buf_v = None
        self._kernels = kernels

    @classmethod
    def create(cls, cache):
        kernels = None
        if torch.device(cache.device).type == "cuda":
            # PyTorch's default pick on Hopper is cuDNN, which builds a new graph (~0.7 ms of CPU)
            # for every new KV length -- and the special stream grows by 6 tokens a frame. The
            # flash kernel has no per-shape set-up (full model on the H200: 63.6 vs 129.9 ms/frame).
            from torch.nn.attention import SDPBackend
            kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
            # RECONSTUDIO_SDPA_KERNELS=cudnn,flash,efficient,math: another priority (benchmarks)
            names = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                     "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
            pick = [names[n] for n in os.environ.get("RECONSTUDIO_SDPA_KERNELS", "").split(",") if n in names]
            kernels = pick or kernels
        return cls(cache, kernels=kernels)

    def plan(self, step: StepTable) -> None:
        return None

    def visible_kv(self, step: StepTable, k_pool: torch.Tensor, v_pool: torch.Tensor):
        """The visible keys/values of one layer as [tokens, H, D] (a view when contiguous)."""
        c = self.cache
        P, H, D, n = c.page_size, c.num_heads, c.head_dim, len(step.pages)
        if self.zero_copy and step.contiguous is not None:
            a, m = step.contiguous
            k = k_pool[a:a + m].reshape(m * P, H, D)
            v = v_pool[a:a + m].reshape(m * P, H, D)
        else:
            if self._buf_k is None:  # once, sized for the largest possible visible set
                shape = (c.num_pages, P, H, D)
                self._buf_k = torch.empty(shape, dtype=c.dtype, device=c.device)
                self._buf_v = torch.empty(shape, dtype=c.dtype, device=c.device)
            k = torch.index_select(k_pool, 0, step.pages_t, out=self._buf_k[:n]).view(n * P, H, D)
            v = torch.index_select(v_pool, 0, step.pages_t, out=self._buf_v[:n]).view(n * P, H, D)
        return k[:step.num_kv_tokens], v[:step.num_kv_tokens]

    def attend(self, step: StepTable, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor):
        k, v = self.visible_kv(step, k_pool, v_pool)
        if k.dtype != q.dtype:  # e.g. an fp32 model over a bf16 cache: compute in q's dtype
            k, v = k.to(q.dtype), v.to(q.dtype)
        qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, L, D]
        if self._kernels is not None:
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel(self._kernels, set_priority=True):
                out = F.scaled_dot_product_attention(qh, kh, vh)
        else:
            out = F.scaled_dot_product_attention(qh, kh, vh)
        return out[0].transpose(0, 1)


class FlashInferBackend(_CacheRef):
    """FlashInfer paged prefill over the same page tables (plan once per step, run per layer)."""

    name = "flashinfer"

    def __init__(self, cache):
        flashinfer, err = _import_flashinfer()
        if flashinfer is None:
            raise KVCacheError(f"FlashInfer is not available ({err})")
        self.cache = cache
        self._workspace = torch.empty(_FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=cache.device)
        # RECONSTUDIO_FLASHINFER_BACKEND=fa2|fa3|auto picks the kernel family (benchmarks)
        kind = os.environ.get("RECONSTUDIO_FLASHINFER_BACKEND", "auto")
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", backend=kind)

    @classmethod
    def create(cls, cache):
        return cls(cache)

    def plan(self, step: StepTable) -> None:
        c = self.cache
        i32 = torch.int32
        self._wrapper.plan(
            torch.tensor([0, step.q_tokens], dtype=i32),
            torch.tensor([0, len(step.pages)], dtype=i32),
            step.pages_t.to(i32),
            torch.tensor([step.last_page_len], dtype=i32),
            c.num_heads, c.num_heads, c.head_dim, c.page_size,
            causal=False, q_data_type=c.dtype, kv_data_type=c.dtype,
        )

    def attend(self, step: StepTable, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor):
        dt = self.cache.dtype
        out = self._wrapper.run(q.to(dt).contiguous(), (k_pool, v_pool))
        return out if out.dtype == q.dtype else out.to(q.dtype)
