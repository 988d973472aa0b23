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


class SettingError(EngineError, ValueError):
    """A setting value of the wrong type or outside its declared choices / range."""


class CheckpointError(EngineError):
    """A checkpoint could not be loaded into a model; the message lists what is wrong."""


def setting(default: Any = None, *, label: str = "", tooltip: str = "", engines: tuple = (),
            choices: Optional[tuple] = None, range: Optional[tuple] = None, group: str = "",
            default_factory: Optional[Callable[[], Any]] = None, cli: bool = True, panel: bool = True,
            step: Optional[float] = None, narrow: Optional[dict] = None):
    """A typed `SessionConfig` field with the metadata that the CLI flags, the settings-panel rows,
    the defaults file, the capabilities and the validation are generated from (one source of truth).

    engines: names of the engines that honour the field (empty = all); choices: allowed values of a
    choice field; narrow: {engine: the subset of `choices` that engine runs}; range: (min, max) of
    a numeric field; group: settings-panel section; cli / panel: whether the field gets a CLI
    flag / a settings-panel row; step: spin-box step."""
    meta = {"label": label, "tooltip": tooltip, "engines": tuple(engines), "choices": choices,
            "range": range, "group": group, "cli": cli, "panel": panel, "step": step,
            "narrow": dict(narrow or {})}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={"setting": meta})
    return field(default=default, metadata={"setting": meta})


def setting_fields(cls: type = None) -> list:
    """The (dataclasses.Field, metadata dict) pairs of the typed settings of `cls` (SessionConfig)."""
    cls = cls or SessionConfig
    return [(f, f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata]


_NEURAL = ("lingbot-map",)
# attention backend names (engine/kv/resolve.py `BACKENDS`): the setting's choices and what
# the neural sessions accept
ATTENTION_BACKENDS = ("auto", "sdpa", "flashinfer", "cudnn", "cudnn-split")
_GEOMETRIC = ("geometric",)
KV_COMPRESSIONS = ("none", "token_partition", "random_subset", "token_merge", "block_sparse")
KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8", "int8")     # engine/kv/dtypes.py names them


@dataclass
class SessionConfig:
    """Settings of one reconstruction session. Engines ignore what they do not use;
    `engine_capabilities()` says which fields each engine honours.

    Every field is declared with `setting(...)`: its metadata generates the CLI flags
    (app/config_flags.py), the settings-panel rows (ui/settings_panel.py), the defaults file
    (resources/default_settings.json) and `engine_capabilities()["fields"]` / tooltips.
    `extra` only carries keys this version does not know (forward compatibility); old sessions
    that stored a now-typed knob in `extra` are read into the typed field by `from_dict`."""

    # -- engine ------------------------------------------------------------------------------
    engine: str = setting("geometric", label="Engine", group="Engine",
                          tooltip="Which reconstruction engine runs. The geometric engine needs no weights "
                                  "(CPU, arbitrary scale); neural engines need a checkpoint and are best on a GPU.")
    checkpoint: Optional[str] = setting(None, label="Checkpoint", group="Engine", engines=_NEURAL,
                                        tooltip="Weights file (.pt / .safetensors) of the neural engine.")
    model: str = setting("lingbot-map", label="Architecture", group="Engine", engines=_NEURAL,
                         choices=("lingbot-map", "lingbot-map-tiny"),
                         tooltip="Network architecture the checkpoint is loaded into: lingbot-map (the "
                                 "released 1.2 B model) or lingbot-map-tiny (test-sized).")
    device: str = setting("cpu", label="Device", group="Engine",
                          tooltip="Where the engine runs (cpu, cuda, cuda:N): a GPU is much faster; CPU works everywhere.")
    gpu_memory: float = setting(0.0, label="GPU memory (GiB)", group="Engine", engines=_NEURAL,
                                range=(0.0, 4096.0), step=0.5,
                                tooltip="Memory budget of the neural engine on the GPU, in GiB (0 = what the "
                                        "device has free). A plan picks the window, KV precision, weight "
                                        "precision and KV compression that fit it, preferring the exact path; "
                                        "settings you changed from their defaults are kept, and the run "
                                        "refuses before allocating when nothing fits. Shown in stats.")
    dtype: str = setting("fp32", label="Precision", group="Engine", engines=_NEURAL,
                         choices=("fp32", "bf16", "fp16"),
                         tooltip="Compute precision: bf16/fp16 halve memory and run faster on GPUs; fp32 is "
                                 "the reference but slow.")
    weight_dtype: str = setting("auto", label="Weight precision", group="Engine", engines=_NEURAL,
                                choices=("auto", "bf16", "int8", "fp8"),
                                tooltip="Storage of the trunk's linear-layer weights: auto = the compute "
                                        "precision; int8 / fp8 quantize them per output channel (about half "
                                        "the weight memory of bf16, small accuracy loss).")
    backend: str = setting("auto", label="Attention", group="Engine", engines=_NEURAL,
                           choices=ATTENTION_BACKENDS,
                           tooltip="Attention kernel: flashinfer (paged, CUDA, bf16/fp16), sdpa (PyTorch, "
                                   "any device) or cudnn (cuDNN over a fixed KV capacity: the visible length as a "
                                   "sequence length through the cuDNN frontend when installed, else PyTorch's "
                                   "kernel with a bias mask; CUDA, bf16/fp16; exact, an alternative to flashinfer), "
                                   "cudnn-split (steady-state window through plain cuDNN, the rest through flash / "
                                   "flashinfer, merged exactly, bf16 error within target; with it each streamed step "
                                   "replays as one CUDA graph); auto takes cudnn-split on CUDA for a bf16/fp16 cache, "
                                   "else flashinfer where it runs (also an fp8 cache), else sdpa.")
    cuda_graphs: bool = setting(True, label="CUDA graphs", group="Engine", engines=_NEURAL,
                                tooltip="On CUDA, replay the fixed-shape parts of a frame (patch embed, frame "
                                        "blocks, depth head) as CUDA graphs, and with cudnn-split the whole "
                                        "streamed step as one graph: faster, same outputs. Ignored on CPU.")
    compile_blocks: bool = setting(False, label="Compile blocks", group="Engine", engines=_NEURAL,
                                   tooltip="On CUDA, run the blocks' norm / residual halves through "
                                           "torch.compile: faster steps (same outputs within bf16 tolerance, "
                                           "GPU-tested) after a one-off compile at the first frames. "
                                           "Ignored on CPU.")
    image_width: int = setting(518, label="Input width", group="Engine", engines=_NEURAL, range=(14, 4088),
                               step=14, tooltip="Model input width in pixels (multiple of 14; 518 is what the "
                                                "model was trained at): larger = finer depth and poses, slower.")
    mode: str = setting("streaming", label="Mode", group="Engine", engines=_NEURAL,
                        choices=("streaming", "windowed"),
                        tooltip="streaming keeps one KV cache; windowed restarts it every window and aligns "
                                "the pieces (bounded memory for very long videos, small seams).")
    window_size: int = setting(256, label="Window size", group="Windowed", engines=("lingbot-map", "vggt-1b"),
                               range=(2, 1_000_000),
                               tooltip="Windowed mode: frames per window. Every window_size frames the session "
                                       "restarts with `overlap` frames shared and the new window is aligned "
                                       "to the previous one by a robust Sim(3). Larger = fewer seams, longer "
                                       "attention context (memory is bounded by the engine's own window).")
    overlap: int = setting(4, label="Overlap", group="Windowed", engines=("lingbot-map", "vggt-1b"),
                           range=(1, 100_000),
                           tooltip="Frames shared by consecutive windows (windowed mode) or VGGT chunks, used "
                                   "to align them (confidence-weighted IRLS Sim(3)). More = steadier seams, "
                                   "more repeated work.")
    chunk_size: int = setting(16, label="Chunk size", group="VGGT", engines=("vggt-1b",), range=(2, 4096),
                              tooltip="VGGT: frames processed together in one bidirectional pass; results "
                                      "arrive chunk by chunk. Larger = more context per pass, more memory.")
    sliding_window_num: int = setting(4, label="Chunks in window", group="VGGT", engines=("vggt-1b",),
                                      range=(1, 4096),
                                      tooltip="VGGT: chunks whose keys/values stay cached; a chunk attends to "
                                              "itself and the previous sliding_window_num - 1 chunks. Peak "
                                              "memory ~ sliding_window_num x chunk_size frames; 1 = independent "
                                              "chunks (VGGT-Long).")
    # -- streaming / KV cache ------------------------------------------------------------------
    scale_frames: int = setting(8, label="Scale frames", group="Streaming", engines=_NEURAL, range=(1, 1024),
                                tooltip="Frames of the first, bidirectional pass; they fix the scene scale and "
                                        "are never evicted. More = steadier scale, longer wait before the first result.")
    window: int = setting(64, label="Sliding window", group="Streaming", engines=_NEURAL, range=(1, 100_000),
                          tooltip="Recent frames kept with all their tokens in the KV cache: more = better "
                                  "long-range consistency, more memory and slower steps.")
    keyframe_interval: int = setting(1, label="Keyframe every", group="Streaming", engines=_NEURAL, range=(1, 1000),
                                     tooltip="Every N-th frame stays in the KV cache; the others are reconstructed "
                                             "but forgotten. Larger = longer memory in time, coarser tracking.")
    camera_iterations: int = setting(4, label="Camera iterations", group="Streaming", engines=_NEURAL,
                                     range=(1, 16), tooltip="Camera-head refinement passes: fewer = faster, "
                                                           "poses slightly rougher.")
    special_cap: int = setting(1024, label="Special-token cap", group="Streaming", engines=_NEURAL,
                               range=(1, 10_000_000), step=16,
                               tooltip="How many past frames keep their 6 special (camera) tokens cached: the "
                                       "long-range trajectory memory. Bounds memory.")
    kv_compression: str = setting("none", label="KV compression", group="KV cache", engines=_NEURAL,
                                  choices=KV_COMPRESSIONS, narrow={"vggt-1b": ("none",)},
                                  tooltip="Keep fewer of each cached window frame's tokens: token_partition "
                                          "(keep the most distinctive, FastVGGT-like), random_subset (a seeded "
                                          "random share, AVGGT-like), token_merge (average similar neighbours) "
                                          "or block_sparse (attend to the best-matching blocks only). Less "
                                          "memory and faster global attention, some accuracy loss. Scale frames "
                                          "and special tokens stay exact.")
    kv_keep_ratio: float = setting(0.5, label="KV keep ratio", group="KV cache", engines=_NEURAL,
                                   range=(0.05, 1.0), step=0.05,
                                   tooltip="Share of a compressed frame's patch tokens kept (token_partition, "
                                           "random_subset, token_merge) or of the window's blocks attended "
                                           "(block_sparse).")
    kv_block_size: int = setting(64, label="KV block size", group="KV cache", engines=_NEURAL, range=(1, 4096),
                                 tooltip="Tokens per block of block_sparse attention (selected by the mean key).")
    kv_seed: int = setting(0, label="KV seed", group="KV cache", engines=_NEURAL, range=(0, 2**31 - 1),
                           tooltip="Seed of random_subset (the kept tokens are reproducible for a given seed).")
    kv_dtype: str = setting("auto", label="KV precision", group="KV cache", engines=_NEURAL, choices=KV_DTYPES,
                            narrow={"vggt-1b": ("auto", "bf16", "fp16", "fp32")},
                            tooltip="Storage of the cached keys/values: auto = the compute precision; fp8 / int8 "
                                    "store one byte per value with scales (half of bf16). fp8 is attended in "
                                    "the compute precision (pose error close to bf16's); fastest through "
                                    "backend cudnn-split.")
    # -- several GPUs --------------------------------------------------------------------------
    sequence_parallel: str = setting("off", label="Sequence parallel", group="Multi-GPU",
                                     engines=("lingbot-map", "vggt-1b"), choices=("off", "ring"),
                                     tooltip="ring: split the scale phase's frames over the GPUs of a "
                                             "torch.distributed group (one process per GPU, e.g. torchrun) and "
                                             "pass the keys/values around the ring (exact attention). off: one GPU.")
    ring_world_size: int = setting(0, label="Ring size", group="Multi-GPU", engines=("lingbot-map", "vggt-1b"),
                                   range=(0, 64), tooltip="Ranks expected in the ring; 0 = every rank of the "
                                                          "process group (a mismatch is an error).")
    # -- geometric engine ------------------------------------------------------------------------
    intrinsics: Optional[tuple] = setting(None, label="Intrinsics", group="Camera", engines=_GEOMETRIC,
                                          tooltip="Camera intrinsics 'fx fy cx cy width height' of the input frames; "
                                                  "empty = an intrinsics file, else the assumed field of view. Exact "
                                                  "intrinsics give better geometry.")
    intrinsics_file: Optional[str] = setting(None, label="Intrinsics file", group="Camera", engines=_GEOMETRIC,
                                             tooltip="A file with the intrinsics (intrinsics.txt), used when no "
                                                     "numbers are given; one beside the input is found automatically.")
    fov_deg: float = setting(60.0, label="Assumed FOV", group="Camera", engines=_GEOMETRIC, range=(10.0, 170.0),
                             tooltip="Horizontal field of view assumed when no intrinsics are known and "
                                     "self-calibration is off or fails. A wrong value bends the trajectory and the geometry.")
    self_calibration: bool = setting(True, label="Self-calibrate focal", group="Camera", engines=_GEOMETRIC,
                                     tooltip="With no intrinsics given, estimate the focal length from the first "
                                             "frames' tracks (square pixels, centred principal point) instead of "
                                             "assuming the field of view. Stated intrinsics always win.")
    max_side: int = setting(640, label="Working size", group="Geometric", engines=_GEOMETRIC, range=(64, 8192),
                            step=32, tooltip="The geometric engine works at most at this resolution (longest "
                                             "side): larger = denser and more accurate, slower.")
    depth: bool = setting(True, label="Keyframe depth", group="Geometric", engines=_GEOMETRIC,
                          tooltip="Compute dense stereo depth for keyframes (off = poses and sparse points only, faster).")
    depth_width: int = setting(320, label="Depth width", group="Geometric", engines=_GEOMETRIC, range=(64, 8192),
                               step=16, tooltip="Width of the keyframe depth maps: larger = denser, slower.")
    depth_max_lag: int = setting(15, label="Depth max lag", group="Geometric", engines=_GEOMETRIC, range=(0, 200),
                                 tooltip="Keyframes whose depth is still pending after this many frames are "
                                         "dropped from depth (keeps the engine live).")
    max_features: int = setting(400, label="Max features", group="Geometric", engines=_GEOMETRIC,
                                range=(20, 5000), tooltip="Corners tracked per frame: more = steadier tracking, slower.")
    loop_closure: bool = setting(True, label="Loop closure", group="Geometric", engines=_GEOMETRIC,
                                 tooltip="Recognise places seen before, correct the drift of every keyframe "
                                         "(Sim(3) pose graph) and place a segment started after a tracking loss "
                                         "in the existing map. Runs on a worker thread.")
    map_point_reuse: bool = setting(True, label="Map-point reuse", group="Geometric", engines=_GEOMETRIC,
                                    tooltip="At each keyframe, match the map points that are no longer "
                                            "tracked again (projected, then found by optical flow from the "
                                            "keyframe that saw them), so revisited places tie to the old map "
                                            "instead of being triangulated again: less scale drift, a few ms "
                                            "more per keyframe.")
    rotation_aided: bool = setting(True, label="Rotation-aided tracking", group="Geometric", engines=_GEOMETRIC,
                                   tooltip="When a fast turn leaves too few mapped points in view for the "
                                           "camera pose, take the turn from all tracked corners and only the "
                                           "position from the mapped points left, instead of losing tracking "
                                           "and starting a new segment.")
    loop_flow_verify: bool = setting(True, label="Loop image verification", group="Geometric", engines=_GEOMETRIC,
                                     tooltip="Confirm a revisited place by following the earlier keyframe's "
                                             "corners into the new image by optical flow (after a coarse "
                                             "alignment) when their descriptors do not match, e.g. blurred or "
                                             "turned views of a hand-held camera; also try the keyframes "
                                             "nearest the current pose. Keeps a small image per keyframe.")
    loop_max_keyframes: int = setting(1000, label="Loop keyframes", group="Geometric", engines=_GEOMETRIC,
                                      range=(10, 100_000),
                                      tooltip="Most keyframes kept for recognising places (loop closure and "
                                              "relocalisation, about 45 KB each). Keyframes of a place already "
                                              "stored are not kept again, so a long run in one area stays "
                                              "well below it; beyond it the most redundant keyframe is dropped.")
    init_max_frames: int = setting(300, label="Start-up window", group="Geometric", engines=_GEOMETRIC,
                                   range=(10, 100_000),
                                   tooltip="Frames held while waiting for enough sideways motion to start "
                                           "tracking; they are all posed once it starts. Raise it for very slow "
                                           "motions (memory: one frame each); beyond it the oldest are given up.")
    init_min_parallax_deg: float = setting(1.0, label="Start-up parallax", group="Geometric", engines=_GEOMETRIC,
                                           range=(0.1, 10.0),
                                           tooltip="Median angle (degrees) between the two views of the "
                                                   "first map's points. Lower starts sooner on slow or far "
                                                   "scenes, with a less accurate first map.")
    max_depth_ratio: float = setting(8.0, label="Max depth", group="Geometric", engines=_GEOMETRIC,
                                     range=(1.5, 1000.0),
                                     tooltip="Keyframe depth farther than this multiple of the median scene "
                                             "depth is dropped (far, low-parallax depth is unreliable and "
                                             "draws as streaks, e.g. the sky or a distant background).")
    # -- synthetic engine (soak tests: engine/synthetic.py) -------------------------------------
    synthetic_fps: float = setting(0.0, label="Synthetic rate", group="Synthetic", engines=("synthetic",),
                                   range=(0.0, 1000.0), tooltip="Frames per second the synthetic engine "
                                   "emits (0 = as fast as possible).")
    synthetic_segment_frames: int = setting(0, label="Segment every", group="Synthetic", engines=("synthetic",),
                                            range=(0, 1_000_000), tooltip="The synthetic engine starts a new "
                                            "segment every N frames (0 = never).")
    # -- input timing ----------------------------------------------------------------------------
    fps: float = setting(30.0, label="Folder frame rate", group="Input", range=(0.1, 1000.0),
                         tooltip="Frame rate assumed for image folders (their timestamps = index / fps); "
                                 "videos use their own clock.")
    # one decode size for every client (GUI worker, `run`, second views): the same input gives
    # the same frames, hence the same reconstruction, whichever client runs it
    decode_max_side: int = setting(1920, label="Decode size", group="Input", range=(0, 16384),
                                   tooltip="Input frames (video, folder, webcam) are downscaled on "
                                           "decoding so their longer side is at most this many pixels "
                                           "(0 = keep the input's size). Engines work at their own, "
                                           "smaller size; this bounds the decode and copy cost of "
                                           "large (4K) inputs.")
    # keys this version does not know (kept for forward compatibility; never behaviour)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        # Older versions kept some knobs in `extra` (cuda_graphs, model, intrinsics_file, depth,
        # depth_width, ...): such a key moves into its typed field, so saved sessions and old
        # callers keep working and nothing behaves through `extra`.
        self.extra = dict(self.extra or {})
        for f in dataclasses.fields(self):
            if f.name != "extra" and f.name in self.extra:
                setattr(self, f.name, coerce_setting(f, self.extra.pop(f.name)))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SessionConfig":
        """From a saved dict (JSON, INI): values converted to the field types (ValueError names a
        bad one); unknown keys are kept in `extra`."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        extra = dict(d.get("extra") or {}) if isinstance(d.get("extra"), dict) else {}
        kw = {}
        for k, v in d.items():
            if k == "extra":
                continue
            if k in fields:
                kw[k] = coerce_setting(fields[k], v)
            else:
                extra[k] = v
        return cls(**kw, extra=extra)


def _field_kind(f: dataclasses.Field) -> type:
    """The value type of a setting: bool, int, float, str or tuple (Optional stripped)."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    for name, kind in (("bool", bool), ("int", int), ("float", float), ("tuple", tuple), ("dict", dict)):
        if t == name or t == f"Optional[{name}]":
            return kind
    return str


def coerce_setting(f: dataclasses.Field, value: Any) -> Any:
    """`value` (from JSON, an INI file or an old `extra`) as the field's type; None stays None for
    optional fields. Raises ValueError with the field name on a value that cannot be converted."""
    kind = _field_kind(f)
    if value is None:
        return None
    try:
        if kind is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return low in ("1", "true", "yes", "on")
            return bool(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind is float:
            return float(value)
        if kind is tuple:
            return tuple(value)
        if kind is dict:
            return dict(value)
        return value if isinstance(value, str) else str(value)
    except (TypeError, ValueError):
        raise SettingError(f"invalid setting {f.name}: cannot use {value!r} as {kind.__name__}") from None


def field_choices(meta: dict, engine: Optional[str] = None) -> Optional[tuple]:
    """The values a choice field allows for `engine`: its `narrow` entry, else its choices."""
    return (meta.get("narrow") or {}).get(engine, meta.get("choices"))


def setting_problems(cfg: "SessionConfig") -> list[str]:
    """Values of the wrong type, outside a field's declared choices (as narrowed for
    `cfg.engine`) or outside its range: one message each; [] = all fine. The one check of every
    declared value -- the CLI, the settings panel and the sessions all call it (sessions through
    `check_settings`); only relations between fields are checked by the engines themselves."""
    out = []
    for f, meta in setting_fields(type(cfg)):
        v = getattr(cfg, f.name)
        if v is None:
            continue
        kind = _field_kind(f)
        if kind is int and (not isinstance(v, int) or isinstance(v, bool)):
            out.append(f"{f.name} must be an integer (got {v!r})")
            continue
        if kind is float and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            out.append(f"{f.name} must be a number (got {v!r})")
            continue
        choices = field_choices(meta, cfg.engine)
        if choices and v not in choices:
            out.append(f"{f.name} must be one of {', '.join(map(str, choices))} (got {v!r})")
        rng = meta.get("range")
        if rng and isinstance(v, (int, float)) and not isinstance(v, bool) and not (rng[0] <= v <= rng[1]):
            out.append(f"{f.name} must be between {rng[0]:g} and {rng[1]:g} (got {v!r})")
    return out


def check_settings(cfg: "SessionConfig", error: Callable[[str], EngineError]) -> None:
    """Raise `error(...)` listing every `setting_problems` of `cfg` (a session's first check)."""
    problems = setting_problems(cfg)
    if problems:
        raise error("; ".join(problems))


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
                      segment replaces earlier ones). With `frames=(first, last)` (input indices,
                      inclusive) it applies only to the segment's results in that range (e.g. one
                      keyframe's stretch after a loop closure); for each result the latest event
                      of its segment whose range contains it wins (no range = the whole segment).
          "segment" — a new segment starts (tracking lost / window restart); `message` says why
          "info" / "warning" — text for the status bar
    """

    kind: str
    segment: int = 0
    transform: Optional[np.ndarray] = None
    message: str = ""
    frames: Optional[tuple] = None      # (first, last) input indices a "realign" applies to; None = all


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
_BUILTIN_MODULES = {"geometric": "engine.geometric", "lingbot-map": "engine.lingbot",
                    "synthetic": "engine.synthetic", "vggt-1b": "engine.vggt"}


# why a built-in engine cannot run here: a missing optional third-party dependency
_UNAVAILABLE: dict[str, str] = {}
# the project's own packages: an ImportError raised from one of them is a bug, never "unavailable"
PROJECT_PACKAGES = ("engine", "app", "ui", "resources", "tests", "benchmarks", "scripts")


def missing_dependency(exc: ImportError) -> Optional[str]:
    """The reason an engine is unavailable when `exc` says a third-party module is missing
    ("torch is not installed: No module named 'torch'"), or None when the ImportError comes from
    the project's own code (or cannot be told apart): then it must propagate."""
    name = getattr(exc, "name", None)
    if not name or name.split(".")[0] in PROJECT_PACKAGES:
        return None
    return f"{name.split('.')[0]} is not installed or does not import ({type(exc).__name__}: {exc})"


def _ensure_builtin_engines(name: Optional[str] = None) -> None:
    import importlib

    for engine_name, module in _BUILTIN_MODULES.items():
        if engine_name in _FACTORIES or engine_name in _UNAVAILABLE or (name is not None and engine_name != name):
            continue
        try:
            importlib.import_module(module)  # registers itself
        except ImportError as exc:
            reason = missing_dependency(exc)
            if reason is None:
                raise                        # a broken import of our own code: fail loudly
            _UNAVAILABLE[engine_name] = reason


def available_engines() -> list[str]:
    """Engines that can be opened here (registered; built-ins whose imports succeed)."""
    _ensure_builtin_engines()
    return list(_FACTORIES)


def unavailable_engines() -> dict[str, str]:
    """Built-in engines that cannot run here, with the reason (a missing optional dependency)."""
    _ensure_builtin_engines()
    return dict(_UNAVAILABLE)


def _no_engine(name: str) -> EngineError:
    if name in _UNAVAILABLE:
        return EngineError(f"engine {name!r} is unavailable: {_UNAVAILABLE[name]}")
    return EngineError(f"unknown engine {name!r}; available: {', '.join(_FACTORIES) or 'none'}")


def engine_capabilities(name: str) -> dict:
    """Which settings an engine honours and their allowed values, e.g.
    {"label": "Geometric (CPU)", "needs_checkpoint": False, "devices": ["cpu"],
     "dtypes": [...], "backends": [...], "modes": [...], "kv_compression": [...], "kv_dtypes": [...],
     "fields": ["scale_frames", "window", ...]}"""
    _ensure_builtin_engines(name)
    if name not in _CAPABILITIES:
        raise _no_engine(name)
    return _with_setting_metadata(name, dict(_CAPABILITIES[name]))


# capability key holding the allowed values of a choice field (the engine may narrow them)
CHOICE_KEYS = {"device": "devices", "dtype": "dtypes", "backend": "backends", "mode": "modes",
               "kv_compression": "kv_compression", "kv_dtype": "kv_dtypes"}


def _with_setting_metadata(name: str, caps: dict) -> dict:
    """Capabilities completed from the `setting()` metadata: "fields" = the engine's own list plus
    every field whose metadata names the engine (or all engines); "tooltips" = the metadata's
    (an engine registered from outside may add its own); a field's choices = the metadata's, as
    narrowed for this engine (`field_choices`). Built-in engines declare no choice lists or
    tooltips of their own: the metadata is the one place."""
    declared = list(caps.get("fields", []))
    fields = list(declared)
    tips = {}
    for f, meta in setting_fields():
        if f.name == "engine":
            continue
        if (name in meta["engines"] or not meta["engines"]) and f.name not in fields:
            fields.append(f.name)
        if meta["tooltip"]:
            tips[f.name] = meta["tooltip"]
        key = CHOICE_KEYS.get(f.name, f"{f.name}_choices")
        if meta["choices"] and key not in caps and f.name in fields:
            caps[key] = list(field_choices(meta, name))
    tips.update(caps.get("tooltips") or {})
    caps["fields"] = fields
    caps["tooltips"] = tips
    return caps


def open_session(config: SessionConfig, model: Any = None) -> Session:
    """Open a streaming session. `model` is a loaded network for neural engines (None for the
    geometric engine; a neural engine given None builds and loads `config.checkpoint`)."""
    _ensure_builtin_engines(config.engine)
    factory = _FACTORIES.get(config.engine)
    if factory is None:
        raise _no_engine(config.engine)
    try:
        return factory(config, model)
    except ImportError as exc:      # the session's heavy imports (torch, ...) load here
        reason = missing_dependency(exc)
        if reason is None:
            raise                   # our own code: fail loudly
        raise EngineError(f"engine {config.engine!r} cannot run here: {reason}") from exc
