"""VGGT-1B: the offline model (engine/vggt/model.py, built from engine/models' shared layers)
and its chunked streaming session (engine/vggt/session.py).

`engine.build_model("vggt-1b")` builds the released architecture (state dict =
`shared/fixtures/vggt_keys.tsv`, 1797 keys); "vggt-tiny" is the same design scaled down for tests.
This package's __init__ imports no torch, so the registry can list the engine cheaply.
"""
from __future__ import annotations

from typing import Any

from ..api import SessionConfig, register_engine

CAPABILITIES = {
    "label": "VGGT-1B (neural, chunked)",
    "needs_checkpoint": True,
    "devices": ["cpu", "cuda"],
    "dtypes": ["fp32", "bf16", "fp16"],
    "backends": ["auto", "sdpa", "flashinfer", "cudnn"],
    "modes": ["streaming", "windowed"],
    "kv_compression": ["none"],
    "kv_dtypes": ["auto", "fp32", "bf16", "fp16"],
    "fields": ["checkpoint", "device", "dtype", "backend", "image_width", "mode", "chunk_size",
               "sliding_window_num", "overlap", "window_size", "camera_iterations", "kv_dtype", "fps"],
}


def _factory(config: SessionConfig, model: Any):
    if config.mode == "windowed":
        from ..windowed import WindowedSession
        return WindowedSession(config, model)
    from .session import VGGTChunkedSession
    return VGGTChunkedSession(config, model)


register_engine("vggt-1b", _factory, CAPABILITIES)
