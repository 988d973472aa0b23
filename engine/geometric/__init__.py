"""The weight-free "geometric" engine: monocular visual odometry (KLT + PnP + sliding-window
bundle adjustment) with keyframe stereo depth, on the CPU with OpenCV and scipy.

Importing this package registers the engine; the session module loads on first use."""
from __future__ import annotations

from ..api import SessionConfig, register_engine

CAPABILITIES = {
    "label": "Geometric (CPU, no weights)",
    "needs_checkpoint": False,
    "devices": ["cpu"],
    "dtypes": ["fp32"],
    "backends": ["auto"],
    "modes": ["streaming"],
    "kv_compression": ["none"],
    "kv_dtypes": ["auto"],
    "fields": ["intrinsics", "fov_deg", "max_side", "fps"],
    "tooltips": {
        "intrinsics": "Camera focal lengths and principal point (fx fy cx cy width height) of the input. "
                      "Exact intrinsics give the most accurate trajectory; an intrinsics.txt beside the "
                      "input is used automatically.",
        "fov_deg": "Assumed horizontal field of view when no intrinsics are known (default 60°). "
                   "A wrong value bends the trajectory and the geometry.",
        "max_side": "Frames are processed at most at this size (longest side, pixels). Smaller is "
                    "faster but less accurate.",
        "fps": "Frame rate used for timestamps of image folders.",
        "scale": "Monocular reconstruction: the scale is arbitrary (the first map has median depth 1); "
                 "only shapes and relative distances are meaningful.",
    },
}


def _factory(config: SessionConfig, model=None):
    from .session import GeometricSession
    return GeometricSession(config, model)


register_engine("geometric", _factory, CAPABILITIES)
