"""Paged KV cache for the streaming global attention, and the attention backends that read it.

`PagedKVCache` (paged_cache.py) owns the page pools and every page table; the backends
(backends.py: SDPA gather / zero-copy, FlashInfer paged prefill) only read the tables it builds
once per step. See docs/interfaces.md "Paged KV cache".
"""
from .paged_cache import (  # noqa: F401
    PAGE_FREE,
    PAGE_PENDING,
    PAGE_SCALE,
    PAGE_SPECIAL,
    PAGE_WINDOW,
    KVCacheError,
    PagedKVCache,
    StepTable,
)
from .backends import available_backends, flashinfer_available, resolve_backend  # noqa: F401

__all__ = [
    "PagedKVCache", "StepTable", "KVCacheError", "available_backends", "flashinfer_available",
    "resolve_backend", "PAGE_FREE", "PAGE_SCALE", "PAGE_WINDOW", "PAGE_SPECIAL", "PAGE_PENDING",
]
