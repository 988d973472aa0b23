"""Paged KV cache for the streaming global attention, and the attention backends that read it.

* page_table.py: the page tables (plain integers: free list, streams, step protocol, rollback);
  the special stream's "pinned + ring" policy is `CappedRing` (engine/models/capped_ring.py,
  shared with the camera cache: this package imports engine/models, never the reverse);
* pool.py: the tensors (page pools, fp8 / int8 scales) and every byte move;
* attention.py: what every attention backend shares and declares (`Support`, `refusal`);
* backends.py: SDPA and FlashInfer attention over the pools; cudnn.py: cuDNN over a fixed
  capacity; cudnn_split.py: the cuDNN split; cudnn_kernels.py: the kernels they call;
* resolve.py: the backend a cache gets, chosen from the declarations (with the refusals);
* compression.py: window compressors (token_partition, random_subset, token_merge, block_sparse);
* dtypes.py: the one dtype table and the session's KV precision decision;
* paged_cache.py: `PagedKVCache`, composing the above; coordinator.py: `StreamCaches`, which
  steps the KV cache and the camera-head cache together.
See docs/interfaces.md "Paged KV cache".
"""
from .page_table import (  # noqa: F401
    PAGE_FREE,
    PAGE_PENDING,
    PAGE_SCALE,
    PAGE_SPECIAL,
    PAGE_WINDOW,
    CappedRing,
    KVCacheError,
    PageTable,
    StepTable,
)
from .dtypes import COMPUTE_DTYPES, KV_DTYPES, KVPrecision, kv_precision, parse_dtype  # noqa: F401
from .backends import flashinfer_available  # noqa: F401
from .resolve import available_backends, choose_backend, resolve_backend  # noqa: F401
from .compression import METHODS as KV_COMPRESSIONS, make_compressor  # noqa: F401
from .paged_cache import PagedKVCache  # noqa: F401

__all__ = [
    "PagedKVCache", "StepTable", "PageTable", "CappedRing", "KVCacheError", "KVPrecision", "kv_precision",
    "parse_dtype", "COMPUTE_DTYPES", "KV_DTYPES", "KV_COMPRESSIONS", "make_compressor",
    "available_backends", "choose_backend", "flashinfer_available", "resolve_backend",
    "PAGE_FREE", "PAGE_SCALE", "PAGE_WINDOW", "PAGE_SPECIAL", "PAGE_PENDING",
]
