"""Every environment variable ReconStudio reads, declared once (name, type, default, choices, doc).

This module is the ONLY place `os.environ` is read for a ``RECONSTUDIO_*`` name
(tests/engine/test_envs.py fails on a read anywhere else). Environment variables are for
process-level switches only -- where sessions and settings live, the store's threads, how the
tests and the bundle are set up. A choice that changes how a reconstruction runs (a backend, a
kernel path, a precision) is a typed `SessionConfig` field declared with `setting()`
(engine/api.py), never a variable here; a measured variant that was not adopted is deleted, not
kept behind a switch.

Use: `envs.get("RECONSTUDIO_SESSIONS")` (or the attribute `envs.RECONSTUDIO_SESSIONS`) returns the
parsed value, or the default when the variable is unset or empty; a malformed value raises
`EnvError` naming the variable and what it accepts. Values are read on every call (no cache), so a
test may set a variable with monkeypatch. docs/environment.md is generated from `VARIABLES`
(`python -m engine.envs --write`); a test fails when it is stale.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


class EnvError(ValueError):
    """A RECONSTUDIO_* environment variable holds a value of the wrong form."""


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: str                       # "path" | "int" | "float" | "flag" (0/1, true/false, yes/no, on/off)
    default: Any
    scope: str                      # who sets it: "user", "tests", "packaging"
    doc: str
    minimum: Optional[float] = None


VARIABLES: tuple = (
    EnvVar("RECONSTUDIO_SESSIONS", "path", None, "user",
           doc="Folder that holds the saved sessions (default `$XDG_DATA_HOME/reconstudio/sessions`, "
               "else `~/.local/share/reconstudio/sessions`); `--session-dir` overrides it per run."),
    EnvVar("RECONSTUDIO_SETTINGS", "path", None, "user",
           doc="INI file of the GUI's settings (default: the user's Qt config folder); tests point it "
               "at a temporary file."),
    EnvVar("RECONSTUDIO_STORE_WRITERS", "int", None, "user", minimum=1,
           doc="Writer threads of the session store (default: one per 4 CPU cores, 1 to 3)."),
    EnvVar("RECONSTUDIO_BUNDLE_TORCH", "flag", True, "packaging",
           doc="`0` leaves torch out of the PyInstaller bundle (packaging/reconstudio.spec): only the "
               "geometric engine works then."),
    EnvVar("RECONSTUDIO_BLOCK_QT", "flag", False, "tests",
           doc="`1` makes every Qt package unimportable in the test process (tests/conftest.py): the "
               "engine tests prove the engine needs no Qt."),
    EnvVar("RECONSTUDIO_SHARED", "path", None, "tests",
           doc="The shared data and fixtures folder of the tests (default `../shared` beside the "
               "checkout)."),
    EnvVar("RECONSTUDIO_SOAK_SECONDS", "float", 180.0, "tests", minimum=0.0,
           doc="Length of the GUI soak test (tests/ui/test_ui_soak.py), in seconds."),
    EnvVar("RECONSTUDIO_ACCURACY_LOG", "path", None, "tests",
           doc="File the engine tests' accuracy checks append their values and limits to (JSON lines; "
               "benchmarks/cpu_dispatch_spread.py reads it). Unset: nothing is recorded."),
)

_BY_NAME = {v.name: v for v in VARIABLES}
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def declared(name: str) -> EnvVar:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared environment variable (engine/envs.py)") from None


def is_set(name: str) -> bool:
    """The variable is set to a non-empty value."""
    declared(name)
    return bool(os.environ.get(name, "").strip())


def get(name: str) -> Any:
    """The variable's value parsed to its kind, or its default when unset or empty."""
    var = declared(name)
    raw = os.environ.get(name, "").strip()
    if not raw:
        return var.default
    if var.kind == "path":
        return Path(raw).expanduser()
    if var.kind == "flag":
        if raw.lower() not in _FLAGS:
            raise EnvError(f"{name} must be 0 or 1 (got {raw!r})")
        return _FLAGS[raw.lower()]
    try:
        val = int(raw) if var.kind == "int" else float(raw)
    except ValueError:
        val = None
    if val is None or (var.minimum is not None and val < var.minimum):
        what = "a whole number" if var.kind == "int" else "a number"
        bound = f" >= {var.minimum:g}" if var.minimum is not None else ""
        raise EnvError(f"{name} must be {what}{bound} (got {raw!r})")
    return val


def __getattr__(name: str) -> Any:          # `envs.<NAME>`: the parsed value, read now
    if name in _BY_NAME:
        return get(name)
    raise AttributeError(name)


def markdown() -> str:
    """docs/environment.md, generated from `VARIABLES`."""
    lines = ["# Environment variables", "",
             "Generated from `engine/envs.py` (`python -m engine.envs --write`); "
             "tests/engine/test_envs.py fails when this file is stale.", "",
             "ReconStudio reads these and no other `RECONSTUDIO_*` variables, all in `engine/envs.py`. "
             "Anything that changes how a reconstruction runs is a session setting "
             "(`reconstudio run --help`, the settings panel), not an environment variable.", "",
             "| variable | type | default | set by | meaning |", "| --- | --- | --- | --- | --- |"]
    for v in VARIABLES:
        default = "unset" if v.default is None else (("1" if v.default else "0") if v.kind == "flag" else f"{v.default:g}"
                                                     if isinstance(v.default, float) else str(v.default))
        kind = v.kind + (f" >= {v.minimum:g}" if v.minimum is not None else "")
        lines.append(f"| `{v.name}` | {kind} | {default} | {v.scope} | {v.doc} |")
    return "\n".join(lines) + "\n"


DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "environment.md"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--write" in argv:
        DOC_PATH.write_text(markdown(), encoding="utf-8")
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
