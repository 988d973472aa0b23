"""Attention backends declare what they support (engine/kv/attention.py `Support`) and the resolver
chooses from the declarations (engine/kv/resolve.py), reporting why the others were refused, in
the cache's and the session's stats. The KV package has no import cycle, nor with engine/models."""
import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from engine.kv import KVCacheError, PagedKVCache, backends, kv_precision, resolve
from engine.kv.attention import LAYOUTS, STORES, refusal

CUDA = torch.device("cuda")
REPO = Path(__file__).resolve().parents[2]


def test_every_backend_declares_its_support():
    for name, cls in resolve.BACKENDS.items():
        sup = cls.support
        assert cls.name == name
        assert set(sup.devices) <= {"cpu", "cuda"} and sup.devices
        assert set(sup.stores) <= set(STORES) and set(sup.layouts) <= set(LAYOUTS)
        assert set(sup.auto_stores) <= set(sup.stores)
        assert all(isinstance(d, torch.dtype) for d in sup.compute_dtypes)
    assert resolve.BACKENDS["cudnn-split"].support.fixed_shapes            # whole-step graphs
    assert not any(resolve.BACKENDS[n].support.fixed_shapes for n in ("sdpa", "flashinfer", "cudnn"))
    assert resolve.AUTO_ORDER[-1] == "sdpa" and refusal(backends.SDPABackend, "cpu", kv_precision("fp32", "int8"),
                                                       layout="block_sparse", auto=True) is None


def test_auto_chooses_from_the_declarations_and_says_why_not(monkeypatch):
    monkeypatch.setattr(backends, "_import_flashinfer", lambda: (object(), None))
    c = resolve.choose_backend("auto", CUDA, kv_precision("bf16"))
    assert c.backend.name == "cudnn-split" and c.refused == {}
    for kv in ("fp8", "int8"):          # quantized stores attended in 16 bits: the split too
        c = resolve.choose_backend("auto", CUDA, kv_precision("bf16", kv))
        assert c.backend.name == "cudnn-split" and c.refused == {}
    c = resolve.choose_backend("auto", CUDA, kv_precision("fp32", "fp8"))
    assert c.backend.name == "sdpa" and "not fp32" in c.refused["cudnn-split"]
    monkeypatch.setattr(backends, "_import_flashinfer", lambda: (None, "ModuleNotFoundError: flashinfer"))
    monkeypatch.setattr(resolve.BACKENDS["cudnn-split"], "support", dataclasses.replace(
        resolve.BACKENDS["cudnn-split"].support, auto_stores=("native",)))
    c = resolve.choose_backend("auto", CUDA, kv_precision("bf16", "fp8"))
    assert c.backend.name == "sdpa" and "not available (ModuleNotFoundError: flashinfer" in c.refused["flashinfer"]
    assert "'auto' takes cudnn-split for native stores only, not fp8" in c.refused["cudnn-split"]
    c = resolve.choose_backend("auto", "cpu", kv_precision("fp32"))
    assert c.stats() == {"requested": "auto", "chosen": "sdpa", "refused": {
        "cudnn-split": "the cudnn-split attention backend needs a CUDA device",
        "flashinfer": "the flashinfer attention backend needs a CUDA device"}}
    with pytest.raises(KVCacheError, match="flashinfer attention backend supports bf16, fp16 attention, not fp32"):
        resolve.choose_backend("flashinfer", CUDA, kv_precision("fp32"))
    with pytest.raises(KVCacheError, match="cudnn-split attention backend supports bf16, fp16 attention, not fp32"):
        resolve.choose_backend("cudnn-split", CUDA, kv_precision("fp32", "int8"))
    with pytest.raises(KVCacheError, match="flashinfer attention backend reads native, fp8 KV stores, not int8"):
        resolve.choose_backend("flashinfer", CUDA, kv_precision("bf16", "int8"))


def test_a_changed_declaration_changes_the_choice(monkeypatch):
    """Nothing decides by name: a split declared without fp16 is passed over for fp16 caches."""
    monkeypatch.setattr(backends, "_import_flashinfer", lambda: (object(), None))
    split = resolve.BACKENDS["cudnn-split"]
    monkeypatch.setattr(split, "support", dataclasses.replace(split.support, compute_dtypes=(torch.bfloat16,)))
    c = resolve.choose_backend("auto", CUDA, kv_precision("fp16"))
    assert c.backend.name == "flashinfer" and "not fp16" in c.refused["cudnn-split"]
    assert resolve.choose_backend("auto", CUDA, kv_precision("bf16")).backend is split


def test_cache_and_session_stats_carry_the_choice():
    cache = PagedKVCache(1, 2, 8, 4, scale_frames=1, window=2, special_cap=4, backend="auto")
    st = cache.stats()
    assert st["backend_choice"]["chosen"] == "sdpa" and set(st["backend_choice"]["refused"]) == {"cudnn-split",
                                                                                             "flashinfer"}
    assert st["attention"]["name"] == "sdpa"
    from engine import SessionConfig, open_session
    from engine.model_zoo import build_model
    from engine.models.recipe import fill_recipe
    s = open_session(SessionConfig(engine="lingbot-map", image_width=70, scale_frames=2, window=3, special_cap=8,
                                   camera_iterations=1), model=fill_recipe(build_model("lingbot-map-tiny")))
    s.push(torch.rand(3, 56, 70, generator=torch.Generator().manual_seed(0)))
    s.push(torch.rand(3, 56, 70, generator=torch.Generator().manual_seed(1)))
    kv = s.stats()["kv"]
    s.close()
    assert kv["backend_choice"]["requested"] == "auto" and kv["backend_choice"]["chosen"] == "sdpa"
    assert "needs a CUDA device" in kv["backend_choice"]["refused"]["cudnn-split"]
    json.dumps(kv["backend_choice"]), json.dumps(kv["attention"])          # --stats-json writes them


def _imports(path: Path, package: str) -> set:
    """Modules of the engine package that `path` imports (module level and inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            mod = ".".join(base + ([node.module] if node.module else []))
            # `from . import x` loads the submodule x (the package is already being imported)
            out |= ({mod} if node.module else set()) | {f"{mod}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engine"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_no_import_cycle_in_kv_or_between_models_and_kv():
    mods = {}
    for pkg in ("kv", "models"):
        for p in sorted((REPO / "engine" / pkg).glob("*.py")):
            name = f"engine.{pkg}" if p.stem == "__init__" else f"engine.{pkg}.{p.stem}"
            mods[name] = p
    graph = {}
    for name, p in mods.items():
        package = name if p.stem == "__init__" else name.rsplit(".", 1)[0]
        graph[name] = {m for m in _imports(p, package) if m in mods and m != name}
    # packages import their own modules; a module's import of its package is an import of __init__
    seen, stack = {}, []

    def visit(n):
        seen[n] = "open"
        stack.append(n)
        for m in graph[n]:
            if seen.get(m) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in seen:
                visit(m)
        stack.pop()
        seen[n] = "done"
    for n in graph:
        if n not in seen:
            visit(n)
    assert not any(m.startswith("engine.kv") for m in graph["engine.models.camera_head"])


def test_run_stats_json_carries_the_backend_choice(tmp_path):
    """`reconstudio run --stats-json`: the chosen backend and why the others were refused."""
    import numpy as np

    from app.cli import main
    from tests.engine.factories import tiny_checkpoint_and_frames
    ckpt, frames = tiny_checkpoint_and_frames(tmp_path)
    rc = main(["run", str(frames), "--checkpoint", str(ckpt), "--engine", "lingbot-map", "--model", "lingbot-map-tiny",
               "--device", "cpu", "--image-width", "70", "--scale-frames", "2", "--window", "3", "--special-cap", "16",
               "--camera-iterations", "1", "-q", "--session-dir", str(tmp_path / "s"),
               "--stats-json", str(tmp_path / "st.json")])
    assert rc == 0
    choice = json.loads((tmp_path / "st.json").read_text())["engine"]["kv"]["backend_choice"]
    assert choice["requested"] == "auto" and choice["chosen"] == "sdpa"
    assert choice["refused"]["cudnn-split"] == "the cudnn-split attention backend needs a CUDA device"
