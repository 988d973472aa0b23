"""VGGT-1B: the offline model (engine/vggt/model.py, built from engine/models' shared layers)
and its chunked streaming session (engine/vggt/session.py).

`engine.build_model("vggt-1b")` builds the released architecture (state dict =
`shared/fixtures/vggt_keys.tsv`, 1797 keys); "vggt-tiny" is the same design scaled down for tests.
This package's __init__ imports no torch, so the registry can list the engine cheaply.
"""
from __future__ import annotations

from typing import Any

from ..api import SessionConfig, register_engine

# What only the engine knows, and the shared fields it honours besides those whose metadata names
# it; choices (as narrowed by the metadata's `narrow`), ranges and tooltips come from the
# `setting()` metadata (engine/api.py `engine_capabilities`).
CAPABILITIES = {
    "label": "VGGT-1B (neural, chunked)",
    "needs_checkpoint": True,
    "devices": ["cpu", "cuda"],
    "fields": ["checkpoint", "dtype", "backend", "image_width", "mode", "camera_iterations", "kv_dtype"],
}


def _factory(config: SessionConfig, model: Any):
    if config.mode == "windowed":
        from ..windowed import WindowedSession
        return WindowedSession(config, model)
    from .session import VGGTChunkedSession
    return VGGTChunkedSession(config, model)


register_engine("vggt-1b", _factory, CAPABILITIES)
