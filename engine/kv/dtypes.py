"""The one dtype table of the streaming engine: compute dtypes, KV storage dtypes, and the
decision (made once per session) of what the KV cache stores and what attention computes in.

    prec = kv_precision("bf16", "fp8")   # KVPrecision(storage=float8_e4m3fn, attn=bfloat16, quantized=True)

* compute dtypes: fp32 | bf16 | fp16 (the trunk's matmuls).
* KV storage: auto (= compute) | fp32 | bf16 | fp16 (stored as given, no silent downcast) |
  fp8 (float8 e4m3, one byte, a scale per layer, K/V and head) | int8 (one byte, a scale per
  token and head). Attention of a quantized cache runs in the compute dtype on dequantized keys
  (SDPA) or in FlashInfer's fp8 kernel with the scales folded into q and the output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .page_table import KVCacheError

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8 = torch.float8_e4m3fn
QUANTIZED = {"fp8": FP8, "int8": torch.int8}
KV_DTYPES = {**COMPUTE_DTYPES, **QUANTIZED}
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
            "float8_e4m3fn": "fp8", "float8": "fp8", "float64": "fp64"}


def dtype_name(dtype: Any) -> str:
    """Canonical name ("fp32", "bf16", "fp16", "fp8", "int8") of a torch dtype or a name."""
    key = str(dtype).lower().replace("torch.", "")
    return _ALIASES.get(key, key)


def parse_dtype(dtype: Any, allow_quantized: bool = False) -> torch.dtype:
    """torch dtype from a torch dtype or a config name. Float64 is accepted (tests); fp8 / int8
    only where a quantized store is meant (`allow_quantized`)."""
    if dtype is torch.float64:
        return dtype
    name = dtype_name(dtype)
    table = KV_DTYPES if allow_quantized else COMPUTE_DTYPES
    if name not in table:
        raise KVCacheError(f"unknown or unsupported KV-cache dtype {dtype!r}; use "
                           f"{', '.join(table)}")
    return table[name]


@dataclass(frozen=True)
class KVPrecision:
    """What the KV pools store and what attention computes in (decided once per session)."""

    storage: torch.dtype            # pool element dtype (fp8 / int8 pools are byte tensors)
    attn: torch.dtype               # q, dequantized k/v and the attention output
    quantized: bool                 # fp8 / int8 with scales

    @property
    def name(self) -> str:
        return dtype_name(self.storage)

    @property
    def bytes_per_value(self) -> int:
        return torch.empty((), dtype=self.storage).element_size()


def kv_precision(compute: Any, kv: Any = "auto") -> KVPrecision:
    """The session's decision: `kv` "auto" stores the compute dtype; a float kv dtype is stored as
    given and attention runs in it (as before); fp8 / int8 store bytes + scales and attention runs
    in the compute dtype."""
    attn = parse_dtype(compute)
    if kv is None or str(kv) == "auto":
        return KVPrecision(attn, attn, False)
    storage = parse_dtype(kv, allow_quantized=True)
    if storage in QUANTIZED.values():
        return KVPrecision(storage, attn if attn != torch.float64 else torch.float32, True)
    return KVPrecision(storage, storage, False)
