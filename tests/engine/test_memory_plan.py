"""Memory plans (engine/memory_plan.py): the accounting matches what the engine allocates, plans
for larger budgets are never worse, every plan fits its budget, users' settings are kept, and a
budget nothing fits is refused before anything is allocated. CPU only (the planner allocates
nothing; its H200 calibration is in docs/benchmarks.md)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine import SessionConfig, open_session
from engine.memory_plan import (GIB, HEADROOM_BYTES, HEADROOM_FRACTION, MemoryPlanError, camera_cache_bytes, facts_for_name, headroom_bytes,
                                kv_pool_bytes, model_facts, plan_memory)

FULL = SessionConfig(engine="lingbot-map", dtype="bf16", device="cuda")


@pytest.fixture(scope="module")
def facts():
    return facts_for_name("lingbot-map", "bf16")


def test_plans_are_monotone_in_the_budget_and_fit(facts):
    plans = [plan_memory(FULL, b, facts) for b in (8, 12, 16, 80)]
    for p in plans:
        assert p.predicted_peak_bytes + headroom_bytes(p.budget_bytes) <= p.budget_bytes
    orders = [p.quality() for p in plans]
    assert orders == sorted(orders, reverse=True)               # more memory: never further from exact
    windows = [p.window for p in plans]
    assert windows == sorted(windows)
    assert plans[-1].exact and plans[-1].window == 64 and plans[-1].kv_dtype == "auto"
    assert plans[2].exact                                        # 16 GiB: the exact path
    assert plans[1].exact                                        # 12 GiB: the exact path (issue 26's target)
    eight = plans[0]
    assert not eight.exact and eight.window < 64
    assert any("window lowered from 64" in r for r in eight.reasons)
    # a finer sweep: the walk's order never goes up with the budget
    fine = [plan_memory(FULL, b, facts).quality() for b in np.arange(6.0, 14.0, 0.25)]
    assert fine == sorted(fine, reverse=True)


def test_refusal_says_what_is_needed(facts):
    with pytest.raises(MemoryPlanError) as e:
        plan_memory(FULL, 3.0, facts)
    msg = str(e.value)
    assert "not enough GPU memory" in msg and "3.00 GiB" in msg and "smallest plan" in msg
    with pytest.raises(MemoryPlanError):
        plan_memory(FULL, 0, facts)


def test_explicit_settings_are_kept_or_refused(facts):
    # an explicit window is kept; the planner changes only what the user left at its default
    p = plan_memory(SessionConfig(engine="lingbot-map", dtype="bf16", window=32), 8.0, facts)
    assert p.window == 32
    p = plan_memory(SessionConfig(engine="lingbot-map", dtype="bf16", window=128), 8.0, facts)
    assert p.window == 128 and (p.kv_dtype != "auto" or p.kv_compression != "none")
    # every planned knob chosen by the user: nothing may change, so 8 GiB is refused, naming them
    mine = SessionConfig(engine="lingbot-map", dtype="bf16", window=128, kv_dtype="bf16", weight_dtype="bf16",
                         kv_compression="token_partition", kv_keep_ratio=0.9)
    with pytest.raises(MemoryPlanError) as e:
        plan_memory(mine, 8.0, facts)
    assert "window=128" in str(e.value) and "kept as chosen" in str(e.value)
    # the same settings with room enough run as chosen
    assert plan_memory(mine, 40.0, facts).settings() == {
        "window": 128, "kv_dtype": "bf16", "weight_dtype": "bf16", "kv_compression": "token_partition",
        "kv_keep_ratio": 0.9}


@pytest.mark.parametrize("kv,compression", [("fp32", "none"), ("fp8", "none"), ("int8", "none"),
                                            ("fp32", "token_partition")])
def test_kv_accounting_is_the_pool_formula(kv, compression):
    from engine.kv import PagedKVCache, make_compressor
    tiny = facts_for_name("lingbot-map-tiny", "fp32")
    P, scale, window, cap = 30, 3, 5, 16
    cache = PagedKVCache(tiny.num_layers, tiny.num_heads, tiny.head_dim, P, special_tokens=tiny.special_tokens,
                         scale_frames=scale, window=window, special_cap=cap, dtype=kv, attn_dtype="fp32",
                         compression=make_compressor(compression, 0.5))
    kind = kv if kv in ("fp8", "int8") else "native"
    keep = cache.compression.keep_tokens(P) if compression != "none" else None
    predicted = kv_pool_bytes(tiny, P, scale_frames=scale, window=window, special_cap=cap,
                              kv_bytes=1 if kind != "native" else 4, kv_kind=kind, keep_tokens=keep)
    assert predicted == cache.pool.bytes_allocated


def test_weight_and_camera_accounting_match_a_model():
    from engine.model_zoo import build_model
    model = build_model("lingbot-map-tiny").set_dtype(torch.bfloat16)
    f = model_facts(model, "bf16")
    real = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert f.weights("auto") == real
    cam = model.new_camera_cache(3, 4, 40)
    assert camera_cache_bytes(f, 3, 4, 40) == cam.kv.numel() * cam.kv.element_size()
    # int8 trunk weights: the planner's figure against torchao's quantized model
    pytest.importorskip("torchao")
    from engine.weight_quant import quantize_trunk, trunk_linear_bytes
    before = trunk_linear_bytes(model)
    assert before == f.trunk_linear_bytes
    quantize_trunk(model, "int8")
    after = trunk_linear_bytes(model)
    predicted = f.weights("int8") - (f.weight_bytes - f.trunk_linear_bytes)
    assert abs(predicted - after) <= 0.02 * before


def _tiny_session(gpu_memory: float, **kw):
    from tests.engine.factories import random_model
    model = random_model("lingbot-map-tiny", device="cpu")
    cfg = SessionConfig(engine="lingbot-map", model="lingbot-map-tiny", device="cpu", dtype="fp32", image_width=70,
                        scale_frames=2, special_cap=128, camera_iterations=1, gpu_memory=gpu_memory, **kw)
    return open_session(cfg, model=model)


def test_session_runs_the_plan_and_reports_it():
    tiny = facts_for_name("lingbot-map-tiny", "fp32")
    base = SessionConfig(engine="lingbot-map", model="lingbot-map-tiny", dtype="fp32", image_width=70,
                         scale_frames=2, special_cap=128, camera_iterations=1)   # window: the default (64)

    def need(window):        # predicted peak of `window` at 70x70 frames (5x5 patches)
        cfg = SessionConfig(**{**base.to_dict(), "window": window})
        return plan_memory(cfg, 80.0, tiny, patch_tokens=25).predicted_peak_bytes

    assert need(40) < need(41) < need(64)
    # the smallest budget whose room (budget - headroom) holds the window-40 plan: window 40 is the
    # largest window that fits, so the session must run window 40 (it opened planning 518x378's aspect)
    budget = (need(40) + HEADROOM_BYTES) / (1 - HEADROOM_FRACTION) + 16
    assert budget - headroom_bytes(int(budget)) < need(41)
    budget /= GIB
    s = _tiny_session(budget)
    rng = np.random.default_rng(0)
    for _ in range(6):
        s.push(rng.integers(0, 255, (70, 70, 3), dtype=np.uint8))
    s.flush()
    st = s.stats()
    plan = st["memory_plan"]
    assert plan is not None and plan["window"] == s.kv.window == s.config.window
    assert plan["window"] == 40 and plan["kv_dtype"] == "auto"
    assert plan["breakdown_gib"]["kv_pool"] * GIB == pytest.approx(s.kv.pool.bytes_allocated, abs=1)
    assert plan["predicted_peak_gib"] <= plan["budget_gib"]
    assert s.requested_config.window == 64         # what the user asked is kept beside what ran
    s.close()


def test_session_refuses_before_allocating():
    with pytest.raises(MemoryPlanError) as e:
        _tiny_session(0.01)
    assert "not enough GPU memory" in str(e.value)
    # a CPU session without a budget plans nothing
    s = _tiny_session(0.0)
    assert s.stats()["memory_plan"] is None
    s.close()


def test_cli_flag_stats_json_and_refusal(tmp_path, capsys):
    """`--gpu-memory` is generated from the setting; the plan is in --stats-json; a budget nothing
    fits ends the run with the plan's message before the engine allocates."""
    import json


    from app.cli import main
    from tests.engine.factories import tiny_checkpoint_and_frames
    ckpt, frames = tiny_checkpoint_and_frames(tmp_path)
    common = ["run", str(frames), "--checkpoint", str(ckpt), "--engine", "lingbot-map", "--model", "lingbot-map-tiny",
              "--device", "cpu", "--image-width", "70", "--scale-frames", "2", "--special-cap", "128",
              "--camera-iterations", "1", "-q"]
    rc = main(common + ["--gpu-memory", "8", "--session-dir", str(tmp_path / "s"), "--stats-json", str(tmp_path / "st.json")])
    assert rc == 0
    plan = json.loads((tmp_path / "st.json").read_text())["engine"]["memory_plan"]
    assert plan["budget_gib"] == 8.0 and plan["exact"] and plan["window"] == 64
    capsys.readouterr()
    rc = main(common + ["--gpu-memory", "0.01", "--session-dir", str(tmp_path / "s2")])
    assert rc != 0
    assert "not enough GPU memory" in capsys.readouterr().err


def test_the_stream_layer_admits_the_planned_stream():
    """The run path (engine/shared_streams.py -> scheduler) admits a lone stream by its memory plan
    (the default window would not fit the budget, the planned one does) and counts the planned
    caches when a second stream asks for room."""
    from engine.scheduler import AdmissionError, StreamScheduler, stream_cache_bytes
    from tests.engine.factories import random_model
    model = random_model("lingbot-map-tiny", device="cpu")
    base = dict(engine="lingbot-map", model="lingbot-map-tiny", device="cpu", dtype="fp32", image_width=70,
                scale_frames=2, special_cap=128, camera_iterations=1)
    tiny = facts_for_name("lingbot-map-tiny", "fp32")

    def need(window):
        return plan_memory(SessionConfig(**base, window=window), 80.0, tiny, patch_tokens=25).predicted_peak_bytes

    budget = ((need(40) + HEADROOM_BYTES) / (1 - HEADROOM_FRACTION) + 16) / GIB
    full = stream_cache_bytes(model, SessionConfig(**base), (70, 70))["total"]
    sched = StreamScheduler(model, memory_budget_bytes=full - 1)          # the default window: refused
    st = sched.open_stream(SessionConfig(**base, gpu_memory=budget), frame_size=(70, 70))
    assert st.session.config.window == 40 and st.session.requested_config.window == 64
    assert st.estimate["total"] < full
    with pytest.raises(AdmissionError) as e:           # a second stream: the planned caches are counted
        sched.open_stream(SessionConfig(**base, gpu_memory=budget), frame_size=(70, 70))
    assert "window 40" in str(e.value)


def test_the_step_graph_pool_is_counted_inside_the_streamed_workspace():
    """The whole-step graph's private pool (one streamed step's activations) is part of the
    workspace, never beyond it: the session holds it instead of the eager step's activations
    and part graphs (engine/lingbot/model.py `_graphed_step`). Quantized weights run eagerly:
    no pool."""
    from engine.memory_plan import patch_tokens_for, step_graph_bytes, workspace_bytes
    facts = facts_for_name("lingbot-map", "bf16")
    for width in (392, 518, 640):
        tokens = patch_tokens_for(facts, width)
        for scale in (1, 8):
            assert 0 < step_graph_bytes(facts, tokens) < workspace_bytes(facts, tokens, scale)
        assert step_graph_bytes(facts, tokens, "int8") == 0
    cfg = SessionConfig(engine="lingbot-map", dtype="bf16")
    plan = plan_memory(cfg, 8, facts)
    assert plan.as_dict()["step_graph_gib"] * GIB == step_graph_bytes(facts, plan.patch_tokens, plan.weight_dtype)
    assert plan_memory(dataclasses.replace(cfg, weight_dtype="int8"), 8, facts).as_dict()["step_graph_gib"] == 0


@pytest.mark.parametrize("kv", ["fp8", "int8"])
def test_quantized_store_scratch_is_what_the_split_allocates(kv):
    """The plan counts the compute-dtype scratch a quantized store is read into: one layer of
    the pool at the compute width, as CuDNNSplitBackend.scratch_bytes sizes it."""
    from engine.kv.cudnn_split import CuDNNSplitBackend
    from engine.memory_plan import kv_scratch_bytes
    from engine.kv.page_table import PageTable
    tiny = facts_for_name("lingbot-map-tiny", "bf16")
    P, scale, window, cap = 30, 3, 5, 16
    pages = PageTable(P, tiny.special_tokens, scale, window, cap).num_pages
    want = CuDNNSplitBackend.scratch_bytes(pages * P, tiny.num_heads, tiny.head_dim, kv, tiny.compute_bytes)
    got = kv_scratch_bytes(tiny, P, kv, scale_frames=scale, window=window, special_cap=cap)
    assert got == want > 0
    assert kv_scratch_bytes(tiny, P, "native", scale_frames=scale, window=window, special_cap=cap) == 0
