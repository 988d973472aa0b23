"""engine/envs.py is the one registry of RECONSTUDIO_* environment variables: every read goes
through it (a grep of the sources fails on any other), docs/environment.md is generated from it,
and a malformed value is a clear error naming the variable."""
import re
from pathlib import Path

import pytest

from engine import envs

REPO = Path(__file__).resolve().parents[2]
# reads of a RECONSTUDIO_* variable: environ.get / getenv / environ["..."] not followed by "="
# (assignments and setenv in tests write the environment of a child process; they are fine)
_READ = re.compile(r"""(environ\.get|getenv|environ\.setdefault|environ\.pop)\(\s*["']RECONSTUDIO_"""
                   r"""|environ\[\s*["']RECONSTUDIO_[A-Z0-9_]*["']\s*\](?!\s*=[^=])""")
_NAME = re.compile(r"RECONSTUDIO_[A-Z0-9_]+")


def _sources():
    for top in ("engine", "app", "ui", "tests", "benchmarks", "scripts", "packaging"):
        for p in sorted((REPO / top).rglob("*")):
            if p.suffix in (".py", ".spec") and p.is_file():
                yield p


def test_no_module_but_the_registry_reads_the_environment():
    # the pattern itself: reads caught, writes (a child process's environment) not
    for line in ('os.environ.get("RECONSTUDIO_A", "1")', "os.getenv('RECONSTUDIO_A')", 'os.environ["RECONSTUDIO_A"]',
                 'x = os.environ["RECONSTUDIO_A"] == "1"'):
        assert _READ.search(line), line
    for line in ('os.environ["RECONSTUDIO_A"] = "1"', 'monkeypatch.setenv("RECONSTUDIO_A", "1")',
                 'envs.get("RECONSTUDIO_A")'):
        assert not _READ.search(line), line
    offenders = []
    for p in _sources():
        if p in (REPO / "engine" / "envs.py", Path(__file__).resolve()):
            continue
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if _READ.search(line):
                offenders.append(f"{p.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, "read RECONSTUDIO_* through engine.envs:\n" + "\n".join(offenders)


def test_every_variable_named_in_the_code_is_declared():
    declared = {v.name for v in envs.VARIABLES}
    assert len(declared) == len(envs.VARIABLES) <= 8
    named = {}
    for p in _sources():
        if p == Path(__file__).resolve():
            continue
        for name in _NAME.findall(p.read_text(encoding="utf-8")):
            named.setdefault(name, str(p.relative_to(REPO)))
    unknown = {k: v for k, v in named.items() if k not in declared}
    assert not unknown, f"undeclared variables (declare them in engine/envs.py or delete them): {unknown}"
    assert all(v.doc and v.scope in ("user", "tests", "packaging") for v in envs.VARIABLES)


def test_docs_table_is_generated_from_the_registry():
    doc = REPO / "docs" / "environment.md"
    assert doc.read_text(encoding="utf-8") == envs.markdown(), (
        "docs/environment.md is stale: run `python -m engine.envs --write`")
    for v in envs.VARIABLES:
        assert f"`{v.name}`" in envs.markdown()


def test_values_are_parsed_and_checked(monkeypatch):
    monkeypatch.delenv("RECONSTUDIO_STORE_WRITERS", raising=False)
    assert envs.get("RECONSTUDIO_STORE_WRITERS") is None                  # unset: the default
    monkeypatch.setenv("RECONSTUDIO_STORE_WRITERS", " 3 ")
    assert envs.get("RECONSTUDIO_STORE_WRITERS") == 3 == envs.RECONSTUDIO_STORE_WRITERS
    for bad in ("0", "two", "1.5"):
        monkeypatch.setenv("RECONSTUDIO_STORE_WRITERS", bad)
        with pytest.raises(envs.EnvError, match="RECONSTUDIO_STORE_WRITERS must be a whole number >= 1"):
            envs.get("RECONSTUDIO_STORE_WRITERS")
    monkeypatch.setenv("RECONSTUDIO_BUNDLE_TORCH", "off")
    assert envs.get("RECONSTUDIO_BUNDLE_TORCH") is False
    monkeypatch.setenv("RECONSTUDIO_BUNDLE_TORCH", "maybe")
    with pytest.raises(envs.EnvError, match="RECONSTUDIO_BUNDLE_TORCH must be 0 or 1"):
        envs.get("RECONSTUDIO_BUNDLE_TORCH")
    monkeypatch.setenv("RECONSTUDIO_SESSIONS", "~/runs")
    assert envs.get("RECONSTUDIO_SESSIONS") == Path("~/runs").expanduser()
    monkeypatch.setenv("RECONSTUDIO_SESSIONS", "")
    assert envs.get("RECONSTUDIO_SESSIONS") is None                       # empty = unset
    with pytest.raises(KeyError, match="not a declared"):
        envs.get("RECONSTUDIO_CUDNN_MODE")
