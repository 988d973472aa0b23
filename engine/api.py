"""The engine contract shared by every engine, the GUI, the CLI and the checks.

Nothing here imports Qt or a model: this module only defines the data that crosses the boundary
(`SessionConfig`, `FrameResult`, `EngineEvent`), the `Session` protocol every engine implements and
the registry `open_session` dispatches through.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import numpy as np


class EngineError(RuntimeError):
    """A user-facing engine failure (bad input, bad settings). The message is shown as-is."""


class CheckpointError(EngineError):
    """A checkpoint could not be loaded into a model; the message lists what is wrong."""


def setting(default: Any = None, *, label: str = "", tooltip: str = "", engines: tuple = (),
            choices: Optional[tuple] = None, range: Optional[tuple] = None, group: str = "",
            default_factory: Optional[Callable[[], Any]] = None, cli: bool = True, panel: bool = True):
    """A typed `SessionConfig` field with the metadata that the CLI flags, the settings-panel rows,
    the defaults file and the capabilities are generated from (one source of truth).

    engines: names of the engines that honour the field (empty = all); choices: allowed values of a
    choice field; range: (min, max) of a numeric field; group: settings-panel section;
    cli / panel: whether the field gets a CLI flag / a settings-panel row."""
    meta = {"label": label, "tooltip": tooltip, "engines": tuple(engines), "choices": choices,
            "range": range, "group": group, "cli": cli, "panel": panel}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={"setting": meta})
    return field(default=default, metadata={"setting": meta})


def setting_fields(cls: type = None) -> list:
    """The (dataclasses.Field, metadata dict) pairs of the typed settings of `cls` (SessionConfig)."""
    cls = cls or SessionConfig
    return [(f, f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata]


@dataclass
class SessionConfig:
    """Settings of one reconstruction session. Engines ignore what they do not use;
    `engine_capabilities()` says which fields each engine honours."""

    engine: str = "geometric"           # "geometric" | "lingbot-map" | ...
    checkpoint: Optional[str] = None    # weights file for neural engines
    device: str = "cpu"                 # "cpu" | "cuda" | "cuda:N"
    dtype: str = "fp32"                 # "fp32" | "bf16" | "fp16" (neural engines)
    backend: str = "auto"               # attention backend: "auto" | "sdpa" | "flashinfer"
    image_width: int = 518              # model input width (height follows the aspect, multiple of 14)
    mode: str = "streaming"             # "streaming" | "windowed"
    scale_frames: int = 8               # frames of the bidirectional scale phase (never evicted)
    window: int = 64                    # sliding window of cached frames (full tokens)
    keyframe_interval: int = 1          # every N-th frame stays in the KV cache
    camera_iterations: int = 4          # camera-head refinement iterations
    special_cap: int = 1024             # max frames whose special tokens stay cached
    kv_compression: str = "none"
    kv_dtype: str = "auto"              # "auto" (= compute dtype) | "bf16" | "fp16" | "fp32"
    # geometric engine
    intrinsics: Optional[tuple] = None  # (fx, fy, cx, cy, width, height) of the input frames
    fov_deg: float = 60.0               # assumed horizontal FOV when no intrinsics are known
    max_side: int = 640                 # geometric engine works at most at this resolution
    # input timing
    fps: float = 30.0                   # for sources without timestamps (image folders)
    # synthetic engine (soak tests)
    synthetic_fps: float = setting(0.0, label="Synthetic rate", engines=("synthetic",), range=(0.0, 1000.0),
                                   group="Synthetic", tooltip="Frames per second the synthetic engine emits "
                                   "(0 = as fast as possible).")
    synthetic_segment_frames: int = setting(0, label="Segment every", engines=("synthetic",), range=(0, 1000000),
                                            group="Synthetic", tooltip="The synthetic engine starts a new "
                                            "segment every N frames (0 = never).")
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SessionConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("intrinsics") is not None:
            kw["intrinsics"] = tuple(kw["intrinsics"])
        return cls(**kw)


@dataclass
class FrameResult:
    """One reconstructed frame. Poses are camera-to-world, OpenCV axes (x right, y down, z fwd)."""

    index: int                          # input frame index (0-based, in push order)
    timestamp: float                    # seconds of input time
    is_keyframe: bool
    c2w: np.ndarray                     # 4x4 float64
    K: np.ndarray                       # 3x3 float64, for `image`/`depth` resolution
    image: np.ndarray                   # h x w x 3 uint8 RGB at result resolution
    depth: Optional[np.ndarray] = None  # h x w float32 (0 = no depth), None if not computed
    conf: Optional[np.ndarray] = None   # h x w float32, larger = more confident
    pose_enc: Optional[np.ndarray] = None  # 9 float32 (neural engines)
    segment: int = 0                    # window / tracking segment id


@dataclass
class EngineEvent:
    """Something the client must know besides per-frame results.

    kind: "realign" — segment `segment` is placed by the 4x4 similarity `transform` (absolute:
                      applied to the segment's results as produced; the latest event for a
                      segment replaces earlier ones)
          "segment" — a new segment starts (tracking lost / window restart); `message` says why
          "info" / "warning" — text for the status bar
    """

    kind: str
    segment: int = 0
    transform: Optional[np.ndarray] = None
    message: str = ""


class Session(Protocol):
    config: SessionConfig

    def push(self, frame: Any, timestamp: Optional[float] = None) -> list[FrameResult]: ...
    def flush(self) -> list[FrameResult]: ...
    def stats(self) -> dict: ...
    def poll_events(self) -> list[EngineEvent]: ...
    def close(self) -> None: ...


# --- registry -------------------------------------------------------------------------------
# Engines register a factory `(config, model) -> Session` and a capability description. The
# registry lets the GUI list engines without importing torch-heavy modules until one is opened.

_FACTORIES: dict[str, Callable[[SessionConfig, Any], Session]] = {}
_CAPABILITIES: dict[str, dict] = {}


def register_engine(name: str, factory: Callable[[SessionConfig, Any], Session], capabilities: dict) -> None:
    _FACTORIES[name] = factory
    _CAPABILITIES[name] = capabilities


# Built-in engines and the module that registers each; imported on demand so opening the
# geometric engine never pays for importing torch.
_BUILTIN_MODULES = {"geometric": "engine.geometric", "lingbot-map": "engine.lingbot_engine",
                    "synthetic": "engine.synthetic"}


def _ensure_builtin_engines(name: Optional[str] = None) -> None:
    import importlib

    for engine_name, module in _BUILTIN_MODULES.items():
        if engine_name in _FACTORIES or (name is not None and engine_name != name):
            continue
        try:
            importlib.import_module(module)  # registers itself
        except ImportError:
            pass


def available_engines() -> list[str]:
    _ensure_builtin_engines()
    return list(_FACTORIES)


def engine_capabilities(name: str) -> dict:
    """Which settings an engine honours and their allowed values, e.g.
    {"label": "Geometric (CPU)", "needs_checkpoint": False, "devices": ["cpu"],
     "dtypes": [...], "backends": [...], "modes": [...], "kv_compression": [...], "kv_dtypes": [...],
     "fields": ["scale_frames", "window", ...]}"""
    _ensure_builtin_engines(name)
    if name not in _CAPABILITIES:
        raise EngineError(f"unknown engine {name!r}; available: {', '.join(_FACTORIES) or 'none'}")
    return dict(_CAPABILITIES[name])


def open_session(config: SessionConfig, model: Any = None) -> Session:
    """Open a streaming session. `model` is a loaded network for neural engines (None for the
    geometric engine; a neural engine given None builds and loads `config.checkpoint`)."""
    _ensure_builtin_engines(config.engine)
    factory = _FACTORIES.get(config.engine)
    if factory is None:
        raise EngineError(f"unknown engine {config.engine!r}; available: {', '.join(_FACTORIES) or 'none'}")
    return factory(config, model)
