"""Choosing the attention backend of a KV cache from the backends' declarations.

`BACKENDS` maps the names of the `backend` setting to the backend classes; each class declares
what it supports (`Support`, engine/kv/attention.py). `choose_backend(name, device, precision,
head_dim, layout)` returns a `Choice`: the class, and for "auto" the reason each faster backend
was refused. "auto" tries `AUTO_ORDER`, fastest first -- the cuDNN split, then FlashInfer, then
SDPA, which serves everything (docs/benchmarks.md has the measurements behind the order); a
named backend that cannot serve the cache is an error that says why. The choice and the refusals
appear in `PagedKVCache.stats()["backend_choice"]`, hence in session stats and
`reconstudio run --stats-json`.

This module imports the backend modules; none of them imports it (no import cycle).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .attention import refusal
from .backends import FlashInferBackend, SDPABackend
from .cudnn import CuDNNBackend
from .cudnn_split import CuDNNSplitBackend
from .dtypes import QUANTIZED, KVPrecision, kv_precision, parse_dtype
from .page_table import KVCacheError

BACKENDS = {"sdpa": SDPABackend, "flashinfer": FlashInferBackend, "cudnn": CuDNNBackend,
            "cudnn-split": CuDNNSplitBackend}
AUTO_ORDER = ("cudnn-split", "flashinfer", "sdpa")


@dataclass
class Choice:
    requested: str                      # the setting's value ("auto", "sdpa", ...)
    backend: type                       # the class chosen
    refused: dict = field(default_factory=dict)     # name -> why not (the candidates "auto" passed over)

    def stats(self) -> dict:
        return {"requested": self.requested, "chosen": self.backend.name, "refused": dict(self.refused)}


def as_precision(dtype: Any) -> KVPrecision:
    """A KVPrecision from a KVPrecision, a torch dtype or a dtype name (a bare fp8 / int8 store:
    attention dtype unknown, taken as float32)."""
    if isinstance(dtype, KVPrecision):
        return dtype
    storage = parse_dtype(dtype, allow_quantized=True)
    if storage in QUANTIZED.values():
        return KVPrecision(storage, torch.float32, True)
    return kv_precision(storage) if storage != torch.float64 else KVPrecision(storage, storage, False)


def choose_backend(name: Optional[str], device: Any, dtype: Any, head_dim: Optional[int] = None,
                   layout: str = "pages") -> Choice:
    """The backend for a cache on `device` storing `dtype` (a KVPrecision, torch dtype or name)
    with `head_dim` and compression `layout` (engine/kv/attention.py LAYOUTS); KVCacheError with
    the reason for a named backend that cannot serve it, or an unknown name."""
    name = (name or "auto").lower()
    prec = as_precision(dtype)
    if name == "auto":
        refused = {}
        for cand in AUTO_ORDER:
            why = refusal(BACKENDS[cand], device, prec, head_dim, layout, auto=True)
            if why is None:
                return Choice("auto", BACKENDS[cand], refused)
            refused[cand] = why
        raise KVCacheError(f"no attention backend serves this cache: {refused}")
    cls = BACKENDS.get(name)
    if cls is None:
        raise KVCacheError(f"unknown attention backend {name!r}; use auto, {', '.join(BACKENDS)}")
    why = refusal(cls, device, prec, head_dim, layout)
    if why is not None:
        raise KVCacheError(f"{why}; choose another backend ('auto' picks one that runs here, 'sdpa' runs "
                           f"everywhere){'; ' + cls.support.note if cls.support.note else ''}")
    return Choice(name, cls, {})


def resolve_backend(name: Optional[str], device: Any, dtype: Any, head_dim: Optional[int] = None,
                    layout: str = "pages") -> type:
    """The class `choose_backend` picks."""
    return choose_backend(name, device, dtype, head_dim, layout).backend


def available_backends(device: Any = "cpu", dtype: Any = None) -> list[str]:
    """Backend names that can serve a `dtype` cache (default bf16) on `device`, "auto" first."""
    prec = as_precision(dtype if dtype is not None else torch.bfloat16)
    return ["auto"] + [n for n, cls in BACKENDS.items() if refusal(cls, device, prec) is None]
