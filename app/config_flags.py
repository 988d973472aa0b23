"""CLI flags generated from the `SessionConfig` setting metadata (one source of truth).

    add_session_flags(parser)          # --window N, --kv-dtype {auto,...}, --depth/--no-depth, ...
    cfg = config_from_args(args, base) # the flags the user gave, applied on top of `base`

Every flag defaults to None ("not given"), so a command keeps its own defaults (the defaults file,
the GUI's saved settings, device-dependent precision) and only what the user typed overrides them.
`run`, `gui`, `eval` and `bench` all call these; a new `setting()` field gets its flag everywhere.

Module level imports nothing heavy (engine.api is numpy-only).
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Iterable, Optional

from engine.api import SessionConfig, _field_kind, setting_fields

# Extra spellings kept from earlier versions of the commands.
ALIASES = {"fov_deg": ("--fov",)}


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


class IntrinsicsFile(str):
    """`--intrinsics PATH`: a file rather than six numbers (goes to `intrinsics_file`)."""


def parse_intrinsics(text: str):
    """Six numbers 'fx,fy,cx,cy,w,h' (commas or spaces) -> tuple, or an existing file ->
    IntrinsicsFile; ValueError with a one-line message otherwise (commands print it and exit 2)."""
    parts = [p for p in str(text).replace(",", " ").split() if p]
    if len(parts) == 6 and not Path(text).expanduser().exists():
        try:
            vals = tuple(float(p) for p in parts)
        except ValueError:
            vals = None
        if vals is not None:
            if min(vals[0], vals[1], vals[4], vals[5]) <= 0:
                raise ValueError("--intrinsics: focal lengths and image size must be positive")
            return vals
    if "," in str(text) and not Path(text).expanduser().exists():
        raise ValueError(f"--intrinsics needs 6 numbers fx,fy,cx,cy,width,height or a file, got {text!r}")
    if not Path(text).expanduser().is_file():
        raise ValueError(f"--intrinsics: intrinsics file not found: {text}")
    return IntrinsicsFile(str(Path(text).expanduser()))


def _ranged(kind, lo, hi, name):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag_name(name)} needs a{'n integer' if kind is int else ' number'}, "
                                             f"got {text!r}") from None
        if lo is not None and not (lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"{flag_name(name)} must be between {lo:g} and {hi:g}, got {text}")
        return v
    parse.__name__ = kind.__name__
    return parse


def session_flag_fields(only: Optional[Iterable[str]] = None, skip: Iterable[str] = ()) -> list:
    only = set(only) if only is not None else None
    skip = set(skip)
    return [(f, m) for f, m in setting_fields()
            if m.get("cli", True) and f.name not in skip and (only is None or f.name in only)]


def add_session_flags(parser: argparse.ArgumentParser, only: Optional[Iterable[str]] = None,
                      skip: Iterable[str] = (), title: str = "session settings",
                      defaults: Optional[dict] = None) -> list[str]:
    """Add one flag per CLI-enabled setting (grouped by the metadata's group); returns the field
    names that got a flag. `only` / `skip` select fields (e.g. a command's own positional);
    `defaults` = what the command uses when a flag is not given, for the help text only."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    names = []
    for f, meta in session_flag_fields(only, skip):
        group_title = f"{title}: {meta['group']}" if meta.get("group") else title
        g = groups.get(group_title) or groups.setdefault(group_title, parser.add_argument_group(group_title))
        kind = _field_kind(f)
        default = f.default if f.default is not dataclasses.MISSING else None
        default = (defaults or {}).get(f.name, default)
        engines = f" [{', '.join(meta['engines'])}]" if meta["engines"] else ""
        tip = meta["tooltip"].replace("%", "%%")
        help_text = f"{tip}{engines} (default: {default})"
        flags = [flag_name(f.name), *ALIASES.get(f.name, ())]
        kw = dict(dest=f.name, default=None, help=help_text)
        if kind is bool:
            g.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif f.name == "intrinsics":
            g.add_argument(*flags, metavar="FILE|fx,fy,cx,cy,w,h", **kw)   # parsed by given_settings
        elif meta.get("choices"):
            g.add_argument(*flags, choices=list(meta["choices"]), **kw)
        elif kind in (int, float):
            lo, hi = meta["range"] if meta.get("range") else (None, None)
            g.add_argument(*flags, type=_ranged(kind, lo, hi, f.name), metavar="N" if kind is int else "X", **kw)
        else:
            g.add_argument(*flags, metavar="PATH" if f.name in ("checkpoint", "intrinsics_file") else "TEXT", **kw)
        names.append(f.name)
    return names


def given_settings(args: argparse.Namespace) -> dict:
    """{field: value} of the session flags present on the command line (not None). ValueError
    with a one-line message for malformed --intrinsics."""
    out = {}
    for f, _meta in setting_fields():
        if not hasattr(args, f.name):
            continue
        v = getattr(args, f.name)
        if v is None:
            continue
        if f.name == "intrinsics" and isinstance(v, str):
            v = parse_intrinsics(v)
            if isinstance(v, IntrinsicsFile):
                out["intrinsics_file"] = str(v)
                continue
        out[f.name] = v
    return out


def config_from_args(args: argparse.Namespace, base: Optional[SessionConfig] = None) -> SessionConfig:
    """`base` (default: SessionConfig()) with every session flag the user gave applied."""
    d = (base or SessionConfig()).to_dict()
    d.update(given_settings(args))
    return SessionConfig.from_dict(d)
