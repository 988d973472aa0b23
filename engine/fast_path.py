"""Whether a neural session's settings run on the fast path, and if not, why
(`stats()["fast_path"]`, issue 26 item 2).

The fast path on CUDA is fixed-shape global attention (the cuDNN split in its static mode:
engine/kv/cudnn_split.py) with each streamed step replayed as ONE CUDA graph
(engine/lingbot/model.py `_graphed_step`). A session reports:

* ``graphs``: "whole-step" (streamed steps replayed as one graph), "per-part" (the fixed-shape
  parts -- patch embed, frame blocks, depth head -- as graphs, the global attention and camera
  head eager) or "none";
* ``attention``: the backend and, for the split, how its layer calls went;
* ``reason``: why the session is not (or not yet) wholly on the fast path, in words; None when
  every streamed step after the window filled was replayed as one graph.

The decision is made once, by `lingbot_whole_step`; `stats()["step_graph"]` (`on`, `why_not`)
reads the same decision beside the model's graph counters (`step_graph_stats`).
Nothing here measures: it reads what the session and its KV cache recorded.
"""
from __future__ import annotations

from typing import Optional

# the reasons, one place (docs/benchmarks.md "Every setting on the fast path" quotes them)
NOT_CUDA = "CUDA graphs and the cuDNN split are CUDA-only: every step runs eagerly on SDPA"
GRAPHS_OFF = "cuda_graphs is off: every step runs eagerly"
QUANTIZED_WEIGHTS = ("int8 / fp8 trunk weights (torchao) run eagerly: the session keeps torchao's "
                     "weight-only linears out of CUDA graphs (capture not verified)")
BLOCK_SPARSE_QUANTIZED = ("block_sparse over a {kind} store: the split gathers the chosen window blocks from "
                          "a native 16-bit store only, so these steps attend on its fallback (no fixed shapes, "
                          "no whole-step graph)")
FILLING = ("the window is filling: the patch run grows by a frame each step (a new attention shape per "
           "frame), so these steps run per part until the window is full")
FP32_ATTENTION = "attention in float32: the cuDNN split takes bf16 / fp16 only"
CLOSED = "the session is closed: its graphs were freed"
GRAPH_SCOPE = "graph scope {scope!r} captures parts only (the global attention and camera head run eagerly)"


def attention_name(kv_stats: Optional[dict]) -> Optional[str]:
    """The backend and, for the split, its layer calls per path ("cudnn-split: split 2304, ...")."""
    if not kv_stats:
        return None
    name = (kv_stats.get("attention") or {}).get("name") or kv_stats.get("backend")   # the instance's
    paths = kv_stats.get("attention_paths")
    if paths and paths.get("calls"):
        calls = ", ".join(f"{k} {v}" for k, v in paths["calls"].items() if v)
        return f"{name}: {calls}" if calls else name
    return name


def lingbot_whole_step(session, kv_stats: Optional[dict] = None) -> dict:
    """THE decision for a LingBot-Map session (engine/lingbot/session.py): {"graphs", "reason"} --
    whether its streamed steps run as whole-step graphs and, when not (or not wholly), why.
    `stats()["fast_path"]` and `stats()["step_graph"]` (`on`, `why_not`) are both built from it
    (`lingbot_fast_path`, `step_graph_stats`), so they cannot disagree. `kv_stats`: its KV cache's
    stats() (the caller has them already)."""
    kv = session.kv
    model, cfg = session.model, session.config
    agg = model.aggregator
    if session.device.type != "cuda":
        return {"graphs": "none", "reason": NOT_CUDA}
    if agg.graphs is None:
        reason = (QUANTIZED_WEIGHTS if getattr(model, "weight_dtype", None)
                  else GRAPHS_OFF if not getattr(cfg, "cuda_graphs", True) else CLOSED)
        return {"graphs": "none", "reason": reason}
    scope = getattr(agg, "graph_scope", "step")
    if scope != "step":
        return {"graphs": "per-part", "reason": GRAPH_SCOPE.format(scope=scope)}
    replays, error = model.step_graph_replays, model.step_graph_error
    reasons = []
    if error is not None:
        reasons.append(f"whole-step graphs stopped: {error}")
    if kv is None:
        reasons.append("no streamed step yet")
    elif kv.compression.sparse_attention and kv.pool.kind != "native":
        reasons.append(BLOCK_SPARSE_QUANTIZED.format(kind=kv.pool.kind))
    elif not kv.attention.support.fixed_shapes:
        why = ((kv_stats or {}).get("backend_choice") or {}).get("refused", {}).get("cudnn-split")
        reasons.append(f"the {kv.backend.name} backend has no fixed-shape steps"
                       + (f" (cudnn-split: {why})" if why else ""))
    else:
        be = kv.attention
        if getattr(be, "error", None):
            reasons.append(f"the split's kernel failed, its fallback attends from then on: {be.error}")
        st = kv_stats or {}
        cached = st.get("cached_frames", 0) - st.get("scale_frames", 0)
        if cached < cfg.window - 1:
            reasons.append(FILLING)
        elif not replays and error is None:
            reasons.append("no streamed step was replayed as one graph yet")
    return {"graphs": "whole-step" if (replays and error is None) else "per-part",
            "reason": "; ".join(reasons) or None}


def lingbot_fast_path(session, kv_stats: Optional[dict] = None, decision: Optional[dict] = None) -> dict:
    """`fast_path` of a LingBot-Map session: {graphs, attention, reason}, from `decision`
    (`lingbot_whole_step`'s, computed here when not given)."""
    if kv_stats is None and session.kv is not None:
        kv_stats = session.kv.stats()
    decision = decision or lingbot_whole_step(session, kv_stats)
    return {"graphs": decision["graphs"], "attention": attention_name(kv_stats), "reason": decision["reason"]}


def step_graph_stats(model, decision: dict) -> dict:
    """`step_graph` of a LingBot-Map session: `on` (its streamed steps replay as whole-step
    graphs) and `why_not` read from `decision` (`lingbot_whole_step`: the same words as
    fast_path's `reason`), beside the model's counters: replays, step graphs held, what their
    captures added to the reserved memory (`pool_gib`; the plan's figure: engine/memory_plan.py
    `step_graph_bytes`) and the capture error."""
    graphs = model.aggregator.graphs
    n = graphs.step_graphs() if hasattr(graphs, "step_graphs") else 0
    return {"on": decision["graphs"] == "whole-step", "replays": model.step_graph_replays, "graphs": n,
            "pool_gib": model.step_graph_pool_bytes / 2**30, "error": model.step_graph_error,
            "why_not": decision["reason"]}


def windowed_fast_path(inner_fast_path: dict, window_size: int) -> dict:
    """A windowed session: its inner streaming session's, plus the restart's cost."""
    out = dict(inner_fast_path or {})
    note = (f"windowed: the cache restarts every {window_size} frames, so each window fills again "
            f"(per-part steps) and captures its graphs again")
    out["reason"] = "; ".join(r for r in (out.get("reason"), note) if r)
    return out


def vggt_fast_path(kv_stats: Optional[dict], device_type: str) -> dict:
    """A VGGT-1B chunked session: chunks run eagerly (no CUDA graphs)."""
    reason = ("VGGT runs a chunk of chunk_size frames per step, eagerly (no CUDA graphs): the launches "
              "are spread over the chunk's frames, and a stream's last chunk is shorter")
    if device_type != "cuda":
        reason = NOT_CUDA
    return {"graphs": "none", "attention": attention_name(kv_stats), "reason": reason}
