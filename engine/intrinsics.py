"""Camera intrinsics for the geometric engine and the evaluation tools.

Sources, in order of precedence (see `resolve_intrinsics`):
1. numbers — `SessionConfig.intrinsics = (fx, fy, cx, cy, width, height)` of the input frames;
2. a file in the `fx fy cx cy width height` format of the shared data (`# comments` allowed),
   found automatically as `intrinsics.txt` beside a sequence (`find_intrinsics`);
3. a default pinhole camera with the horizontal field of view `SessionConfig.fov_deg`
   (60° unless set), square pixels, principal point at the image centre. With
   `SessionConfig.self_calibration` (default) the geometric engine replaces its focal length by
   one estimated from the first frames (engine/geometric/selfcal.py); stated intrinsics always win.

Intrinsics are always stated for a resolution; `Intrinsics.scaled_to(w, h)` rescales them when the
input is resized (the aspect ratio must match, otherwise the file belongs to another camera).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .api import EngineError

__all__ = [
    "IntrinsicsError", "Intrinsics", "read_intrinsics", "find_intrinsics", "default_intrinsics",
    "resolve_intrinsics", "DEFAULT_FOV_DEG",
]

DEFAULT_FOV_DEG = 60.0
INTRINSICS_FILENAME = "intrinsics.txt"


class IntrinsicsError(EngineError):
    """Intrinsics that cannot be read or do not fit the frames (message is user-facing)."""


@dataclass(frozen=True)
class Intrinsics:
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int

    def __post_init__(self):
        vals = (self.fx, self.fy, self.cx, self.cy, self.width, self.height)
        if not all(math.isfinite(float(v)) for v in vals):
            raise IntrinsicsError(f"intrinsics contain non-finite numbers: {vals}")
        if self.width <= 0 or self.height <= 0:
            raise IntrinsicsError(f"intrinsics image size must be positive, got {self.width}x{self.height}")
        if self.fx <= 0 or self.fy <= 0:
            raise IntrinsicsError(
                f"focal lengths must be positive (fx={self.fx}, fy={self.fy}); a negative fy usually "
                "means a y-flipped camera model, which the engine does not support")
        if not (0 < self.cx < self.width and 0 < self.cy < self.height):
            raise IntrinsicsError(
                f"principal point ({self.cx}, {self.cy}) lies outside the {self.width}x{self.height} image")

    @classmethod
    def from_sequence(cls, values: Sequence[float]) -> "Intrinsics":
        vals = list(values)
        if len(vals) != 6:
            raise IntrinsicsError(
                f"intrinsics need 6 numbers (fx fy cx cy width height), got {len(vals)}: {vals}")
        try:
            fx, fy, cx, cy = (float(v) for v in vals[:4])
            w, h = float(vals[4]), float(vals[5])
        except (TypeError, ValueError) as exc:
            raise IntrinsicsError(f"intrinsics must be numbers (fx fy cx cy width height): {exc}") from None
        if w != int(w) or h != int(h):
            raise IntrinsicsError(f"intrinsics width/height must be whole pixels, got {w}x{h}")
        return cls(fx, fy, cx, cy, int(w), int(h))

    def as_tuple(self) -> tuple:
        return (self.fx, self.fy, self.cx, self.cy, self.width, self.height)

    def matrix(self) -> np.ndarray:
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    def scaled_to(self, width: int, height: int, tolerance: float = 0.02) -> "Intrinsics":
        """The same camera at another resolution (engine.geometry.scale_intrinsics: integer pixel
        centres, so cx' = (cx + 0.5) * s - 0.5)."""
        if (width, height) == (self.width, self.height):
            return self
        sx, sy = width / self.width, height / self.height
        if abs(sx / sy - 1.0) > tolerance:
            raise IntrinsicsError(
                f"intrinsics are for {self.width}x{self.height} but the frames are {width}x{height} "
                "(a different aspect ratio): is this the right intrinsics file for this input?")
        from .geometry import scale_intrinsics
        K = scale_intrinsics(self.matrix(), (self.height, self.width), (height, width))
        return Intrinsics(float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2]), int(width), int(height))


def read_intrinsics(path: Union[str, Path]) -> Intrinsics:
    """Parse an intrinsics file: 6 numbers `fx fy cx cy width height` on the first non-comment
    line (`#` starts a comment)."""
    p = Path(path)
    if not p.is_file():
        raise IntrinsicsError(f"intrinsics file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise IntrinsicsError(f"cannot read intrinsics file {p}: {exc}") from None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        try:
            return Intrinsics.from_sequence(parts)
        except IntrinsicsError as exc:
            raise IntrinsicsError(f"{p}: {exc}") from None
    raise IntrinsicsError(f"intrinsics file {p} has no 'fx fy cx cy width height' line")


def find_intrinsics(input_path: Union[str, Path, None]) -> Optional[Path]:
    """`intrinsics.txt` beside a sequence: inside a folder input, beside a video file, or in the
    parent of an image folder (the `SEQ/rgb/` layout of the shared data). None if absent."""
    if input_path is None:
        return None
    p = Path(input_path)
    candidates = [p / INTRINSICS_FILENAME, p.parent / INTRINSICS_FILENAME] if p.is_dir() \
        else [p.parent / INTRINSICS_FILENAME]
    for c in candidates:
        if c.is_file():
            return c
    return None


def attach_found_intrinsics(config, input_path) -> str:
    """Point `config` at the `intrinsics.txt` beside `input_path` when it has no intrinsics of its
    own (the CLI and the GUI both do this); returns a note for the user saying which were used.
    Numbers or an `intrinsics_file` the user set win over a found file."""
    if config.intrinsics is not None:
        return "given"
    if getattr(config, "intrinsics_file", None):
        return f"{config.intrinsics_file} (given)"
    is_path = isinstance(input_path, (str, Path)) and str(input_path) and Path(input_path).exists()
    found = find_intrinsics(input_path) if is_path else None      # never for "webcam:N"
    if found is not None:
        config.intrinsics_file = str(found)
        return str(found)
    config.intrinsics_file = None
    if getattr(config, "self_calibration", False) and getattr(config, "engine", "geometric") == "geometric":
        return (f"none found: the focal length is self-calibrated from the first frames "
                f"(else {config.fov_deg:g}° horizontal field of view)")
    return f"assumed {config.fov_deg:g}° horizontal field of view"


def default_intrinsics(width: int, height: int, fov_deg: float = DEFAULT_FOV_DEG) -> Intrinsics:
    """A pinhole camera with horizontal field of view `fov_deg` and square pixels."""
    if not (1.0 < float(fov_deg) < 179.0):
        raise IntrinsicsError(f"field of view must be between 1 and 179 degrees, got {fov_deg}")
    f = (width / 2.0) / math.tan(math.radians(float(fov_deg)) / 2.0)
    return Intrinsics(f, f, (width - 1) / 2.0, (height - 1) / 2.0, int(width), int(height))


def resolve_intrinsics(config, width: int, height: int) -> tuple[Intrinsics, str]:
    """Intrinsics for input frames of `width`x`height` from a SessionConfig, and a note saying
    where they came from. `config.intrinsics_file` names a file when numbers are absent."""
    ifile = getattr(config, "intrinsics_file", None)
    if getattr(config, "intrinsics", None) is not None:
        base = Intrinsics.from_sequence(config.intrinsics)
        source = "given"
    elif ifile:
        base = read_intrinsics(ifile)
        source = f"file {ifile}"
    else:
        fov = getattr(config, "fov_deg", None) or DEFAULT_FOV_DEG
        return default_intrinsics(width, height, fov), f"assumed {float(fov):g}° horizontal FOV"
    return base.scaled_to(width, height), source
