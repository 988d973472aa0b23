"""What every attention backend over the paged KV cache shares: the weak link to its cache, and
the declaration of what it supports (`Support`), from which `engine.kv.resolve` chooses.

A backend class states as class data the devices, compute (attention) dtypes, KV store kinds
and compression layouts it runs, whether it attends with fixed shapes and pointers (whole-step
CUDA graphs: `static_key`), the head dims its kernels take and the optional packages it needs.
`refusal(cls, ...)` turns a declaration and a cache's settings into the reason the backend
cannot serve them (None when it can); nothing else decides by a backend's name or by `hasattr`.

Interface of a backend (engine/kv/backends.py, cudnn.py, cudnn_split.py): `create(cache)`,
`plan(step)` once per step, `attend(step, q, layer, slots_t=None)` with q [n, H, D] already in
the attention dtype; `slots_t` = explicit visible flat slots of this layer (block-sparse), unless
the backend picks the blocks itself (`selects_blocks`, the cuDNN split's fixed-shape steps).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from .dtypes import KVPrecision, dtype_name
from .page_table import KVCacheError

# compression layouts a backend may be handed (engine/kv/compression.py):
#   "pages"        -- whole pages (no compression)
#   "token_slots"  -- a compressed window: visible tokens as a slot list (`StepTable.slots_t`)
#   "block_sparse" -- a slot list per layer (`attend(..., slots_t=)`)
LAYOUTS = ("pages", "token_slots", "block_sparse")
# KV store kinds (engine/kv/pool.py `KVPool.kind`): "native" = stored in a float dtype as given
STORES = ("native", "fp8", "int8")


@dataclass(frozen=True)
class Support:
    devices: tuple                         # device types: "cpu", "cuda"
    compute_dtypes: tuple                  # attention dtypes (torch dtypes)
    stores: tuple                          # KV store kinds it reads (STORES)
    layouts: tuple = LAYOUTS               # compression layouts it accepts (LAYOUTS)
    fixed_shapes: bool = False             # static steps for whole-step CUDA graphs (`static_key`)
    head_dims: Optional[tuple] = None      # None = any
    requires: tuple = ()                   # optional packages it imports (probed by `unavailable`)
    auto_stores: tuple = ()                # stores for which backend "auto" may take it
    note: str = ""                         # why the declaration is what it is (shown with refusals)


def store_kind(precision: KVPrecision) -> str:
    """The store kind of a precision ("native", "fp8", "int8")."""
    if not precision.quantized:
        return "native"
    return dtype_name(precision.storage)


def _names(dtypes) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def store_refusal(cls, precision: KVPrecision, layout: str = "pages") -> Optional[str]:
    """Why backend class `cls` cannot read this store kind or compression layout (None: it can):
    the part of `refusal` a cache checks when it is handed a backend class directly."""
    sup: Support = cls.support
    kind = store_kind(precision)
    if kind not in sup.stores:
        return f"the {cls.name} attention backend reads {', '.join(sup.stores)} KV stores, not {kind}"
    if layout not in sup.layouts:
        return f"the {cls.name} attention backend takes {', '.join(sup.layouts)} layouts, not {layout}"
    return None


def refusal(cls, device, precision: KVPrecision, head_dim: Optional[int] = None,
            layout: str = "pages", auto: bool = False) -> Optional[str]:
    """Why backend class `cls` cannot serve a cache with these settings, from its `support`
    declaration (and its `unavailable()` probe for optional packages); None when it can.
    `auto`: also whether backend "auto" may take it (`Support.auto_stores`)."""
    sup: Support = cls.support
    dev = torch.device(device).type
    kind = store_kind(precision)
    label = cls.name
    if dev not in sup.devices:
        return f"the {label} attention backend needs a {' or '.join(d.upper() for d in sup.devices)} device"
    if precision.attn not in sup.compute_dtypes:
        return (f"the {label} attention backend supports {_names(sup.compute_dtypes)} attention, "
                f"not {dtype_name(precision.attn)}")
    stores = store_refusal(cls, precision, layout)
    if stores:
        return stores
    if sup.head_dims is not None and head_dim is not None and head_dim not in sup.head_dims:
        return f"the {label} attention backend takes head dims {sup.head_dims}, not {head_dim}"
    if auto and kind not in sup.auto_stores:
        return f"backend 'auto' takes {label} for {', '.join(sup.auto_stores) or 'no'} stores only, not {kind}"
    missing = cls.unavailable()
    if missing:
        return f"the {label} attention backend is not available ({missing})"
    return None


class Backend:
    """Base of the attention backends: the declaration slots and the weak link to the cache.

    A backend reaches its cache through a weak reference: the cache owns the backend, so a
    strong link back would make a cycle, and a closed session's KV pools (GiBs on the GPU) would
    stay allocated until Python's cycle collector happened to run."""

    name = ""
    support: Support

    @classmethod
    def unavailable(cls) -> Optional[str]:
        """Why an optional package this backend needs does not import here (None: fine)."""
        return None

    @classmethod
    def create(cls, cache):
        return cls(cache)

    def selects_blocks(self) -> bool:
        """Whether this backend picks a block_sparse step's window blocks itself (from
        `cache.sparse_block_slots`) for the step planned last; else the cache hands every layer
        its token list (`attend(..., slots_t=)`)."""
        return False

    def describe(self) -> dict:
        """What this instance runs and how its steps went (stats; benchmarks)."""
        out = {"name": self.name}
        for key in ("kernel", "mode", "path", "calls", "error", "frontend_error", "dense_error", "paged_note"):
            val = getattr(self, key, None)
            if val is not None:
                out[key] = dict(val) if isinstance(val, dict) else val
        return out

    @property
    def cache(self):
        c = self._cache_ref()
        if c is None:
            raise KVCacheError("KV cache backend used after its cache was freed")
        return c

    @cache.setter
    def cache(self, cache):
        self._cache_ref = weakref.ref(cache)
