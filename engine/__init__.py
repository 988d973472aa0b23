"""ReconStudio engine: models, paged KV cache, streaming sessions, geometric backend, I/O, metrics.

Never imports Qt. Heavy modules (torch models) load lazily on first use.
"""
from .api import (  # noqa: F401
    CheckpointError,
    EngineError,
    EngineEvent,
    FrameResult,
    Session,
    SessionConfig,
    available_engines,
    engine_capabilities,
    open_session,
    register_engine,
    unavailable_engines,
)

__all__ = [
    "CheckpointError", "EngineError", "EngineEvent", "FrameResult", "Session", "SessionConfig",
    "available_engines", "engine_capabilities", "open_session", "register_engine", "unavailable_engines",
    "build_model", "load_checkpoint",
]


def __getattr__(name):
    # build_model / load_checkpoint pull in torch; keep `import engine` light.
    if name == "build_model":
        from .model_zoo import build_model
        return build_model
    if name == "load_checkpoint":
        from .checkpoint import load_checkpoint
        return load_checkpoint
    raise AttributeError(name)
