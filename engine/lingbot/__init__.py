"""LingBot-Map: the model (engine/lingbot/model.py, built from engine/models' shared layers) and
its streaming session (engine/lingbot/session.py); windowed mode is engine/windowed.py.

This package's __init__ registers the "lingbot-map" engine without importing torch: its
capabilities (what the settings panel offers) live here, and the session module (torch, the
model) loads when a session is opened."""
from __future__ import annotations

from typing import Any

from ..api import SessionConfig, register_engine

CAPABILITIES = {
    "label": "LingBot-Map (neural, streaming)",
    "needs_checkpoint": True,
    "devices": ["cpu", "cuda"],
    "dtypes": ["fp32", "bf16", "fp16"],
    "backends": ["auto", "sdpa", "flashinfer", "cudnn"],
    "modes": ["streaming", "windowed"],
    "kv_compression": ["none", "token_partition", "random_subset", "token_merge", "block_sparse"],
    "kv_dtypes": ["auto", "fp32", "bf16", "fp16", "fp8", "int8"],
    "fields": ["checkpoint", "device", "dtype", "backend", "image_width", "scale_frames", "window",
               "keyframe_interval", "camera_iterations", "special_cap", "kv_dtype", "fps", "mode",
               "window_size", "overlap"],
    "tooltips": {
        "scale_frames": "frames of the first, bidirectional pass; they anchor scale and stay cached. "
                        "More = steadier scale, longer wait before the first result",
        "window": "recent frames kept in full in the KV cache. Larger = more context, more memory and time per frame",
        "keyframe_interval": "every N-th frame is cached; the others are reconstructed but forgotten. "
                             "Larger = slower cache turnover, longer memory in time",
        "camera_iterations": "camera-head refinement passes. Fewer = faster, poses slightly rougher",
        "special_cap": "frames whose 6 summary tokens stay cached (long-range memory). Bounds memory",
        "dtype": "bf16/fp16 halve memory and run much faster on GPU; fp32 is the reference",
        "kv_dtype": "storage of the KV cache; auto = the compute dtype; fp8 / int8 = one byte per value "
                    "with scales (half of bf16), attention in the compute dtype",
        "backend": "attention kernel: flashinfer (CUDA, bf16/fp16), sdpa (everywhere) or cudnn "
                   "(CUDA, bf16/fp16, fixed KV capacity; experimental)",
        "image_width": "model input width (multiple of 14); 518 is what the model was trained at",
    },
}



def _factory(config: SessionConfig, model: Any):
    if config.mode == "windowed":            # restart every window_size frames, align (engine/windowed.py)
        from ..windowed import WindowedSession
        return WindowedSession(config, model)
    from .session import LingBotMapSession
    return LingBotMapSession(config, model)


register_engine("lingbot-map", _factory, CAPABILITIES)
