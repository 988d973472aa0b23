"""Bundled resources: the sample clip (ICL-NUIM, CC BY 3.0, see sample/LICENSE.md), icons and
the default settings. Paths work from a source checkout, an installed wheel and a PyInstaller
bundle alike (this package's folder travels with the data)."""
from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def resource_path(*parts: str) -> Path:
    """Absolute path of a bundled file, e.g. resource_path("icons", "reconstudio.svg")."""
    return ROOT.joinpath(*parts)


def sample_clip_path() -> Path:
    """The bundled sample video (200 frames of ICL-NUIM living room kt3, with intrinsics.txt beside it)."""
    return resource_path("sample", "icl_livingroom_kt3.mp4")


def icon_path(size: int | None = None, svg: bool = False) -> Path:
    """The application icon: the SVG, or a PNG (256 px, or the nearest of 32/64/128/256 to `size`)."""
    if svg:
        return resource_path("icons", "reconstudio.svg")
    if size is None:
        return resource_path("icons", "reconstudio.png")
    best = min((32, 64, 128, 256), key=lambda s: (s < size, abs(s - size)))
    return resource_path("icons", f"reconstudio-{best}.png")


@lru_cache(maxsize=1)
def _load_defaults() -> dict:
    return json.loads(resource_path("default_settings.json").read_text(encoding="utf-8"))


def default_settings() -> dict:
    """The default settings (a fresh copy each call, safe to modify)."""
    return copy.deepcopy(_load_defaults())
