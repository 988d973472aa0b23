"""LingBot-Map: the model (engine/lingbot/model.py, built from engine/models' shared layers) and
its streaming session (engine/lingbot/session.py); windowed mode is engine/windowed.py.

This package's __init__ registers the "lingbot-map" engine without importing torch; the session
module (torch, the model) loads when a session is opened."""
from __future__ import annotations

from typing import Any

from ..api import SessionConfig, register_engine

# What only the engine knows; the fields it honours, their choices, ranges and tooltips come from
# the `setting()` metadata of SessionConfig (engine/api.py `engine_capabilities`).
CAPABILITIES = {
    "label": "LingBot-Map (neural, streaming)",
    "needs_checkpoint": True,
    "devices": ["cpu", "cuda"],
}


def _factory(config: SessionConfig, model: Any):
    if config.mode == "windowed":            # restart every window_size frames, align (engine/windowed.py)
        from ..windowed import WindowedSession
        return WindowedSession(config, model)
    from .session import LingBotMapSession
    return LingBotMapSession(config, model)


register_engine("lingbot-map", _factory, CAPABILITIES)
