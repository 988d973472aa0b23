"""The weight-free "geometric" engine: monocular visual odometry (KLT + PnP + sliding-window
bundle adjustment) with keyframe stereo depth, on the CPU with OpenCV and scipy.

Importing this package registers the engine; the session module loads on first use."""
from __future__ import annotations

from ..api import SessionConfig, register_engine

CAPABILITIES = {
    "label": "Geometric (CPU, no weights)",
    "needs_checkpoint": False,
    "devices": ["cpu"],
    # a note of the engine, not a field's tooltip (those are the `setting()` metadata's)
    "tooltips": {
        "scale": "Monocular reconstruction: the scale is arbitrary (the first map has median depth 1); "
                 "only shapes and relative distances are meaningful.",
    },
}


def _factory(config: SessionConfig, model=None):
    from .session import GeometricSession
    return GeometricSession(config, model)


register_engine("geometric", _factory, CAPABILITIES)
