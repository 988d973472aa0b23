"""The app's own persisted settings (display, replay, source, sessions retention): each key
declared once with its type, range or choices and default -- the one place these defaults live.

Session (engine) values are not declared here: they are `SessionConfig` fields, checked with their
own `setting()` metadata (`check_session`). Every value read from the settings file goes through
`check` / `check_session`: a value of the wrong type, out of its range or not finite falls back to
its default and yields one problem line naming the key, so a hand-edited or damaged settings file
never stops the app and never turns into a silently out-of-range value.

Qt-free (the CLI reads the retention keys through app.settings).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from engine.io.retention import DEFAULT_MAX_AGE_DAYS, DEFAULT_MAX_GB
from engine.scene import DEFAULT_POINT_BUDGET, MAX_POINT_BUDGET, MIN_POINT_BUDGET

COLOR_MODES = ("rgb", "depth", "confidence")      # the viewer's colour modes (ui/viewer.py)
SPEEDS = (("As fast as possible", 0.0), ("Real time", 1.0), ("×0.5", 0.5), ("×2", 2.0), ("×4", 4.0))


@dataclass(frozen=True)
class Key:
    """One persisted value: `name` is its settings key ("section/name")."""

    name: str
    kind: type                          # bool, int, float, str or dict
    default: Any
    range: Optional[tuple] = None       # (min, max), inclusive, for int / float
    choices: Optional[tuple] = None     # allowed values
    doc: str = ""


KEYS: dict = {k.name: k for k in (
    Key("run/speed", float, 0.0, range=(0.0, 1000.0),
        doc="replay speed for files: 0 = as fast as possible, 1 = real time, N = N×"),
    Key("run/loop", bool, False, doc="files start again at their end"),
    Key("source/state", dict, {}, doc="the source panel: kind, path, webcam, resolution"),
    Key("display/point_size", float, 2.0, range=(1.0, 12.0), doc="point size in pixels"),
    Key("display/color_mode", str, "rgb", choices=COLOR_MODES, doc="point colours"),
    Key("display/stride", int, 2, range=(1, 16), doc="every N-th pixel of a frame is drawn (and exported)"),
    Key("display/conf_threshold", float, 0.0, range=(-1e30, 1e30),
        doc="minimum confidence, in the engine's absolute units"),
    Key("display/frustums", bool, True, doc="camera frustums drawn"),
    Key("display/all_frustums", bool, False, doc="a frustum for every frame, not only keyframes"),
    Key("display/trajectory", bool, True, doc="camera trajectory drawn"),
    Key("display/follow", bool, True, doc="the view follows the camera"),
    Key("display/point_budget", int, DEFAULT_POINT_BUDGET, range=(MIN_POINT_BUDGET, MAX_POINT_BUDGET),
        doc="most points the 3D view keeps"),
    Key("display/frame_time_target_ms", float, 50.0, range=(5.0, 2000.0),
        doc="time one redraw of the 3D view aims at while things move (ms): fewer points when the "
            "full cloud would take longer; full detail once the view stands still"),
    # ranges as File > Sessions folder's spin boxes (ui/sessions_dialog.py) allow
    Key("sessions/max_gb", float, DEFAULT_MAX_GB, range=(0.0, 100_000.0),
        doc="size limit of the sessions folder in GB (0 = no limit)"),
    Key("sessions/max_age_days", float, DEFAULT_MAX_AGE_DAYS, range=(0.0, 36_500.0),
        doc="sessions older than this many days are removed (0 = no limit)"),
)}

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def default(name: str) -> Any:
    """The declared default of a key (a copy for dicts)."""
    d = KEYS[name].default
    return dict(d) if isinstance(d, dict) else d


def _convert(key: Key, v: Any) -> Any:
    """`v` as the key's type; ValueError when it is not one (no lenient coercion: "maybe" is not
    a bool, 2.5 is not an int, [1, 2] is not a number)."""
    if key.kind is bool:
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
            return v.strip().lower() in _TRUE
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise ValueError("not true / false")
    if key.kind in (int, float):
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError("not a number")
        try:
            x = float(v)
        except ValueError:
            raise ValueError("not a number") from None
        if not math.isfinite(x):
            raise ValueError("not a finite number")
        if key.kind is int:
            if not x.is_integer():
                raise ValueError("not a whole number")
            return int(x)
        return x
    if key.kind is dict:
        if not isinstance(v, dict):
            raise ValueError("not a table of values")
        return v
    if not isinstance(v, str):
        raise ValueError("not text")
    return v


def check(name: str, raw: Any) -> tuple:
    """(value, problem): the stored `raw` value of key `name` (already JSON-decoded when it was
    JSON) checked against its declaration; None (absent) gives the default and no problem; a bad
    value gives the default and one line naming the key, the value and the default used."""
    key = KEYS[name]
    if raw is None:
        return default(name), None
    try:
        v = _convert(key, raw)
        if key.range is not None and not (key.range[0] <= v <= key.range[1]):
            raise ValueError(f"outside {key.range[0]:g}..{key.range[1]:g}")
        if key.choices is not None and v not in key.choices:
            raise ValueError(f"not one of {', '.join(map(str, key.choices))}")
    except ValueError as exc:
        return default(name), f"{name} = {_show(raw)} is {exc}; using {_show(key.default)}"
    return v, None


def check_session(d: Any, base) -> tuple:
    """(SessionConfig, problems) from a stored session dict: each field checked with its
    `setting()` metadata (type through `coerce_setting`, choices, range, finite floats); a bad
    field takes its value in `base` (the defaults) and adds one line naming
    "engine/config/<field>". Unknown keys are kept in `extra`, as `SessionConfig.from_dict` does."""
    from engine.api import SessionConfig, SettingError, coerce_setting, setting_fields

    if d is None:
        return base, []
    if not isinstance(d, dict):
        return base, [f"engine/config = {_show(d)} is not a table of values; using the defaults"]
    meta = {f.name: (f, m) for f, m in setting_fields(SessionConfig)}
    good: dict = {}
    problems: list = []
    for k, v in d.items():
        if k not in meta:
            if k != "extra":
                good[k] = v                                   # from_dict keeps it in `extra`
            continue
        f, m = meta[k]
        why = None
        try:
            x = coerce_setting(f, v)
        except SettingError:
            x, why = None, "of the wrong type"
        if why is None and x is not None:
            rng, ch = m.get("range"), m.get("choices")
            if isinstance(x, float) and not math.isfinite(x):
                why = "not a finite number"
            elif rng and isinstance(x, (int, float)) and not isinstance(x, bool) and not (rng[0] <= x <= rng[1]):
                why = f"outside {rng[0]:g}..{rng[1]:g}"
            elif ch and x not in ch:
                why = f"not one of {', '.join(map(str, ch))}"
        if why is None:
            good[k] = x
        else:
            problems.append(f"engine/config/{k} = {_show(v)} is {why}; using {_show(getattr(base, k))}")
    extra = d.get("extra")
    if isinstance(extra, dict):
        good["extra"] = extra
    merged = dataclasses.replace(base)
    try:
        cfg = SessionConfig.from_dict({**_plain(merged), **good})
    except (TypeError, ValueError) as exc:              # a field's own __post_init__ check
        return base, problems + [f"engine/config: {exc}; using the defaults"]
    return cfg, problems


def _plain(cfg) -> dict:
    d = cfg.to_dict()
    d.pop("extra", None)
    return d


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."
