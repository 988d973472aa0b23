"""The engine registry fails loudly: an ImportError raised by the project's own code propagates
(a broken import is a failure, never "engine not installed"); only a missing optional third-party
dependency makes an engine "unavailable", with the reason, in the registry and at open_session."""
import sys

import pytest

from engine import api
from engine.api import EngineError, SessionConfig


@pytest.fixture
def registry(monkeypatch):
    """The registry's tables, restored after the test (the built-ins registered first: a module
    registers itself once, on import)."""
    api.available_engines()
    monkeypatch.setattr(api, "_BUILTIN_MODULES", dict(api._BUILTIN_MODULES))
    monkeypatch.setattr(api, "_UNAVAILABLE", dict(api._UNAVAILABLE))
    monkeypatch.setattr(api, "_FACTORIES", dict(api._FACTORIES))
    monkeypatch.setattr(api, "_CAPABILITIES", dict(api._CAPABILITIES))
    return api


def test_a_broken_import_of_our_own_code_propagates(registry):
    registry._BUILTIN_MODULES["broken"] = "engine.no_such_module_of_ours"
    with pytest.raises(ModuleNotFoundError, match="engine.no_such_module_of_ours"):
        registry.available_engines()
    with pytest.raises(ModuleNotFoundError):
        registry.engine_capabilities("broken")
    assert "broken" not in registry._UNAVAILABLE


def test_a_missing_third_party_dependency_makes_the_engine_unavailable(registry, tmp_path, monkeypatch):
    (tmp_path / "needs_dep_engine_mod.py").write_text("import reconstudio_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._BUILTIN_MODULES["needs-dep"] = "needs_dep_engine_mod"
    assert "needs-dep" not in registry.available_engines()
    reason = registry.unavailable_engines()["needs-dep"]
    assert reason.startswith("reconstudio_missing_dependency_xyz is not installed")
    with pytest.raises(EngineError, match="'needs-dep' is unavailable: reconstudio_missing_dependency_xyz"):
        registry.engine_capabilities("needs-dep")
    with pytest.raises(EngineError, match="unavailable"):
        registry.open_session(SessionConfig(engine="needs-dep"))
    sys.modules.pop("needs_dep_engine_mod", None)


def test_open_session_tells_a_missing_dependency_from_a_bug(registry):
    def needs_torch(config, model):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    def buggy(config, model):
        raise ImportError("cannot import name 'x' from 'engine.lingbot.session'", name="engine.lingbot.session")

    def unnamed(config, model):
        raise ImportError("something went wrong")
    for name, fn in (("needs-torch", needs_torch), ("buggy", buggy), ("unnamed", unnamed)):
        registry.register_engine(name, fn, {"label": name})
    with pytest.raises(EngineError, match="cannot run here: torch is not installed"):
        registry.open_session(SessionConfig(engine="needs-torch"))
    with pytest.raises(ImportError, match="engine.lingbot.session"):
        registry.open_session(SessionConfig(engine="buggy"))
    with pytest.raises(ImportError, match="went wrong"):       # cannot tell: treated as ours
        registry.open_session(SessionConfig(engine="unnamed"))


def test_every_built_in_engine_imports_here():
    """torch, OpenCV and scipy are test dependencies: nothing built in may be unavailable."""
    assert set(api._BUILTIN_MODULES) <= set(api.available_engines()), api.unavailable_engines()
