"""Each setting's allowed values live in one place, its `setting()` metadata: the engines'
capabilities (what the GUI offers) are derived from it, the sessions validate against it, and the
name tables of the engine code agree with it."""
import pytest

from engine.api import (ATTENTION_BACKENDS, KV_COMPRESSIONS, KV_DTYPES, EngineError, SessionConfig,
                        engine_capabilities, setting_fields, setting_problems)

META = {f.name: m for f, m in setting_fields()}


def test_capabilities_offer_what_the_metadata_declares():
    lb = engine_capabilities("lingbot-map")
    # every declared backend, cudnn-split included (the GUI used to hide it while the CLI took it)
    assert lb["backends"] == list(ATTENTION_BACKENDS) and "cudnn-split" in lb["backends"]
    assert lb["kv_dtypes"] == list(KV_DTYPES) and lb["kv_compression"] == list(KV_COMPRESSIONS)
    assert lb["dtypes"] == list(META["dtype"]["choices"])
    # one tooltip per field: the metadata's
    assert lb["tooltips"]["keyframe_interval"] == META["keyframe_interval"]["tooltip"]
    vg = engine_capabilities("vggt-1b")
    assert vg["kv_dtypes"] == list(META["kv_dtype"]["narrow"]["vggt-1b"]) and "fp8" not in vg["kv_dtypes"]
    assert "kv_compression" not in vg["fields"] and vg["backends"] == list(ATTENTION_BACKENDS)
    assert {"dtype", "backend", "kv_dtype", "chunk_size"} <= set(vg["fields"])
    geo = engine_capabilities("geometric")
    assert "backend" not in geo["fields"] and "backends" not in geo          # not honoured: not offered


def test_sessions_validate_against_the_metadata():
    from engine.lingbot.session import _validate as validate_lingbot
    from engine.vggt.session import validate as validate_vggt
    with pytest.raises(EngineError, match="LingBot-Map settings: keyframe_interval must be between 1 and 1000"):
        validate_lingbot(SessionConfig(engine="lingbot-map", keyframe_interval=0))
    with pytest.raises(EngineError, match="scale_frames must be an integer"):
        validate_lingbot(SessionConfig(engine="lingbot-map", scale_frames=2.5))
    with pytest.raises(EngineError, match="kv_dtype must be one of auto, bf16, fp16, fp32 .got 'fp8'"):
        validate_vggt(SessionConfig(engine="vggt-1b", kv_dtype="fp8"))
    validate_lingbot(SessionConfig(engine="lingbot-map", kv_dtype="fp8", backend="cudnn-split"))
    # the same check the CLI and the settings panel run, before any session
    assert setting_problems(SessionConfig(engine="vggt-1b", kv_compression="token_merge"))
    assert not setting_problems(SessionConfig(engine="lingbot-map", kv_compression="token_merge"))


def test_engine_name_tables_agree_with_the_metadata():
    from engine.kv.compression import METHODS
    from engine.kv.dtypes import COMPUTE_DTYPES, KV_DTYPES as KV_TABLE
    assert set(META["dtype"]["choices"]) == set(COMPUTE_DTYPES)
    assert set(KV_DTYPES) == {"auto", *KV_TABLE}
    assert set(KV_COMPRESSIONS) == set(METHODS)
    from engine.kv import KVCacheError, resolve_backend
    for name in ATTENTION_BACKENDS:               # every declared name is one the resolver knows
        try:
            resolve_backend(name, "cpu", "fp32")
        except KVCacheError as exc:
            assert "unknown" not in str(exc), name
    with pytest.raises(KVCacheError, match="unknown attention backend"):
        resolve_backend("cudnn2", "cpu", "fp32")
