"""Weight quantization of the streaming model's trunk (`SessionConfig.weight_dtype`).

`quantize_trunk(model, "int8" | "fp8")` replaces the weights of every `nn.Linear` of the
aggregator (patch embed, frame and global blocks: the trunk, ~95 % of LingBot-Map's weights)
with torchao's weight-only quantized tensors (`Int8WeightOnlyConfig`: int8 per output channel;
`Float8WeightOnlyConfig`: float8 e4m3 per output channel). Activations stay in the compute
dtype; the camera and depth heads are untouched (they run in float32, as upstream). torchao is
the well-kept library for this; it runs on the CPU build of torch too (its optional CUDA/cutlass
kernels are simply not loaded there).

Quantization is in place (a 4.6 GB model is not copied) and cannot be undone: the model records
`weight_dtype`, and a later session asking for other weights is told to reload the checkpoint.
"""
from __future__ import annotations

import logging

import torch

from .api import EngineError

log = logging.getLogger(__name__)

KINDS = ("int8", "fp8")


def torchao_available() -> bool:
    try:
        import torchao.quantization  # noqa: F401
        return True
    except Exception:
        return False


def _config(kind: str):
    try:
        import torchao.quantization as tq
    except Exception as exc:  # ImportError or a broken build
        raise EngineError(f"weight_dtype {kind} needs torchao (pip install torchao): {exc}") from None
    return tq.Int8WeightOnlyConfig() if kind == "int8" else tq.Float8WeightOnlyConfig()


def trunk_linear_bytes(model) -> int:
    """Bytes of the trunk's linear-layer weights as stored now (quantized tensors included)."""
    total = 0
    for m in model.aggregator.modules():
        if isinstance(m, torch.nn.Linear):
            w = m.weight
            inner = [getattr(w, a) for a in ("qdata", "scale") if hasattr(w, a)]
            if inner:
                total += sum(t.numel() * t.element_size() for t in inner)
            else:
                total += w.numel() * w.element_size()
    return total


def quantize_trunk(model, kind: str) -> dict:
    """Quantize the aggregator's linear weights in place; returns {"before", "after"} bytes."""
    if kind not in KINDS:
        raise EngineError(f"weight_dtype must be one of auto, bf16, {', '.join(KINDS)} (got {kind!r})")
    done = getattr(model, "weight_dtype", None)
    if done == kind:
        return {"before": None, "after": trunk_linear_bytes(model)}
    if done is not None:
        raise EngineError(f"the model's weights were already quantized to {done}; reload the checkpoint "
                          f"to use {kind}")
    before = trunk_linear_bytes(model)
    from torchao.quantization import quantize_
    cfg = _config(kind)
    with torch.no_grad():
        quantize_(model.aggregator, cfg, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear))
    model.weight_dtype = kind
    after = trunk_linear_bytes(model)
    log.info("trunk weights quantized to %s: %.1f -> %.1f MB", kind, before / 1e6, after / 1e6)
    return {"before": before, "after": after}
