"""Memory plans: which LingBot-Map settings fit a GPU-memory budget (`SessionConfig.gpu_memory`).

A streaming session's device memory is four blocks, computed from facts (the workspace from a
calibration), never measured at run time:

* **weights** -- the architecture built on the meta device (no memory, no checkpoint) and
  converted to the compute dtype exactly as a session converts it; int8 / fp8 trunk weights
  (engine/weight_quant.py) store the aggregator's linear weights in one byte plus a float32
  scale per output channel;
* **KV pool** -- the page count of the very `PageTable` the session builds (scale + window +
  step pages + the special zone, or the compact window of a storing compressor) times the pool
  formula of engine/kv/pool.py (keys + values, plus fp8's per-head / int8's per-token scales);
* **camera cache** -- iterations x blocks x K/V x (scale frames + special cap) camera tokens in
  float32 (engine/models/camera_head.py);
* **workspace** -- activations, CUDA-graph pools and attention scratch: the larger of the scale
  step's (a fixed part plus bytes per token of `scale_frames` frames at once) and a streamed
  step's (a fixed part plus bytes per token of one frame), in the compute dtype. The constants
  are calibrated on the H200 (docs/benchmarks.md, "Memory plans", with the commands).

The whole-step CUDA graph's private pool (`step_graph_bytes`, in the plan as `step_graph_gib`)
is inside the streamed step's workspace, not added to it: the pool holds one streamed step's
activations (a capture reuses the blocks it frees), and the eager steps' cached blocks are
returned to CUDA before a capture, which cannot release them itself (engine/lingbot/model.py
`_graphed_step`). Library memory stays bounded too: every capture warms up on one side stream
per device (engine/models/graphs.py), so cuBLAS keeps one workspace for it instead of one per
stream of torch's pool. What the step captures added is in `stats()["step_graph"]["pool_gib"]`;
the H200 figures against this accounting are in docs/benchmarks.md ("Stop 32").

`plan_memory` walks the candidates from the exact path down and returns the first that fits
`budget - headroom` (the headroom: the allocator's fragmentation and the whole-step CUDA graph's
capture, see HEADROOM_BYTES), with the reasons. Order (the first tier that fits wins; within a tier the
largest window):

1. the configured settings (the exact path by default: compute-dtype KV, full window);
2. a shorter window, compute-dtype KV, down to `FAST_MIN_WINDOW`: exact arithmetic and the
   fixed-shape attention + whole-step CUDA graphs stay (int8 weights leave them), only the cached
   context shrinks;
3. fp8 KV (half the pool; still fixed-shape and whole-step graphs, but each step reads the store
   back into a compute-dtype scratch of one layer, `kv_scratch_bytes`: slower than a shorter
   window of the exact path), window from the configured one down to `MIN_WINDOW`;
4. int8 weights + fp8 KV (quantized weights run eagerly: no CUDA graphs);
5. token_partition KV compression (keep 0.5, then 0.25) with int8 weights + fp8 KV.

A setting the user chose (`explicit`: by default every planned field whose value differs from
its `SessionConfig` default) is never changed: candidates keep it, and when none fits the plan
refuses and says which setting is in the way and what the exact path needs. Nothing here
allocates; `session_plan` is what a session calls before it allocates anything.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Optional

from .api import EngineError, SessionConfig

GIB = 2 ** 30

# Planned fields and their defaults: a value other than the default is the user's choice.
PLANNED = ("window", "kv_dtype", "weight_dtype", "kv_compression", "kv_keep_ratio")

MIN_WINDOW = 8          # no plan caches fewer window frames
FAST_MIN_WINDOW = MIN_WINDOW   # tier 2's floor: the exact-arithmetic path with its graphs first

# Workspace calibration (bf16 compute; scaled by the compute dtype's size): the larger of the
# scale step's activations (grows with scale_frames x tokens) and a streamed step's (CUDA-graph
# capture and replay pools, attention scratch: grows with the tokens of one frame). The
# constants bound every calibration shape from above, each term against its own phase's peak
# (`gpu_memory_bench --calibrate` reports the scale phase's and the streamed steps' peaks apart);
# the figures and the command are in docs/benchmarks.md ("Stop 33" and "Memory plans").
WORKSPACE_SCALE_FIXED_BYTES = 0.45 * GIB
WORKSPACE_BYTES_PER_SCALE_TOKEN = 62_000
WORKSPACE_STEP_FIXED_BYTES = 0.35 * GIB
WORKSPACE_BYTES_PER_FRAME_TOKEN = 599_000
# Room kept free beyond the predicted peak: the caching allocator's reserved-but-unallocated
# blocks (fragmentation) and the whole-step CUDA graph's capture, which needs memory on top of
# the peak of the steps before it -- without it the capture fails under a cap and the session
# falls back to the slower per-part graphs (stats()["step_graph"]["error"]). Sized from the
# capped H200 runs (docs/benchmarks.md, "Memory plans").
HEADROOM_FRACTION = 0.02
HEADROOM_BYTES = 512 * 2 ** 20


class MemoryPlanError(EngineError):
    """No setting fits the memory budget (or a user's setting does not); the message says why."""


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs to know about one architecture in one compute dtype."""

    num_layers: int
    num_heads: int
    head_dim: int
    special_tokens: int
    patch_size: int
    weight_bytes: int            # all parameters and buffers, as a session converts them
    trunk_linear_bytes: int      # the aggregator's nn.Linear weights (what int8 / fp8 shrink)
    trunk_linear_rows: int       # their output channels (one float32 scale each when quantized)
    camera_depth: int
    camera_heads: int
    camera_head_dim: int
    compute_bytes: int           # bytes of one value of the compute dtype

    def weights(self, weight_dtype: str) -> int:
        if weight_dtype in ("int8", "fp8"):
            per = self.trunk_linear_bytes // self.compute_bytes      # values
            return self.weight_bytes - self.trunk_linear_bytes + per + 4 * self.trunk_linear_rows
        return self.weight_bytes


def model_facts(model_or_config, dtype: str = "bf16") -> ModelFacts:
    """Facts of a LingBot-Map model (an instance: its architecture is rebuilt on the meta device)
    or of a `LingBotMapConfig`, in compute dtype `dtype`."""
    cfg = getattr(model_or_config, "config", model_or_config)
    key = repr(cfg)
    _CONFIGS[key] = cfg
    return _facts(key, str(dtype))


def facts_for_name(name: str, dtype: str = "bf16") -> ModelFacts:
    """Facts of a model-zoo architecture by name ("lingbot-map", "lingbot-map-tiny")."""
    import torch

    from .model_zoo import build_model
    with torch.device("meta"):
        model = build_model(name)
    return model_facts(model.config, dtype)


_CONFIGS: dict = {}       # repr -> architecture config (the cache key of `_facts`)


@functools.lru_cache(maxsize=8)
def _facts(key: str, dtype: str) -> ModelFacts:
    import torch

    from .kv.dtypes import COMPUTE_DTYPES
    from .lingbot.model import LingBotMap
    tdt = COMPUTE_DTYPES[dtype]
    cfg = _CONFIGS[key]
    with torch.device("meta"):
        model = LingBotMap(cfg)
    model.set_dtype(tdt)
    total = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    lin = [m.weight for m in model.aggregator.modules() if isinstance(m, torch.nn.Linear)]
    geo = model.kv_geometry()
    ch = model.camera_head
    return ModelFacts(
        num_layers=geo["num_layers"], num_heads=geo["num_heads"], head_dim=geo["head_dim"],
        special_tokens=geo["special_tokens"], patch_size=cfg.patch_size, weight_bytes=int(total),
        trunk_linear_bytes=int(sum(w.numel() * w.element_size() for w in lin)),
        trunk_linear_rows=int(sum(w.shape[0] for w in lin)),
        camera_depth=ch.depth, camera_heads=ch.num_heads, camera_head_dim=ch.dim // ch.num_heads,
        compute_bytes=torch.empty((), dtype=tdt).element_size())


# ------------------------------------------------------------------ the accounting
def _pool_pages(facts: ModelFacts, patch_tokens: int, scale_frames: int, window: int, special_cap: int,
                keep_tokens: Optional[int]) -> int:
    """Pages (of `patch_tokens` slots) of one layer's pool: PageTable's own count."""
    from .kv.page_table import PageTable
    keep = keep_tokens if keep_tokens is not None and keep_tokens < patch_tokens else None
    return PageTable(patch_tokens, facts.special_tokens, scale_frames, window, special_cap,
                     keep_tokens=keep).num_pages


def kv_pool_bytes(facts: ModelFacts, patch_tokens: int, *, scale_frames: int, window: int, special_cap: int,
                  kv_bytes: int, kv_kind: str = "native", keep_tokens: Optional[int] = None) -> int:
    """Bytes of the KV pools of a session (engine/kv/pool.py's formula over PageTable's pages).
    kv_kind: "native" | "fp8" | "int8"; kv_bytes: bytes per stored value."""
    pages = _pool_pages(facts, patch_tokens, scale_frames, window, special_cap, keep_tokens)
    L, H, D = facts.num_layers, facts.num_heads, facts.head_dim
    n = 2 * L * pages * patch_tokens * H * D * kv_bytes
    if kv_kind == "fp8":
        n += L * 2 * H * 4
    elif kv_kind == "int8":
        n += L * 2 * pages * patch_tokens * H * 4
    return int(n)


def kv_scratch_bytes(facts: ModelFacts, patch_tokens: int, kv_kind: str, *, scale_frames: int, window: int,
                     special_cap: int, keep_tokens: Optional[int] = None) -> int:
    """The compute-dtype scratch pair a quantized store ("fp8" / "int8") is read into by the
    fixed-shape split attention (one layer's pool capacity: CuDNNSplitBackend.scratch_bytes); 0
    for a native store."""
    if kv_kind == "native":
        return 0
    from .kv.cudnn_split import CuDNNSplitBackend
    pages = _pool_pages(facts, patch_tokens, scale_frames, window, special_cap, keep_tokens)
    return CuDNNSplitBackend.scratch_bytes(pages * patch_tokens, facts.num_heads, facts.head_dim, kv_kind,
                                           facts.compute_bytes)


def camera_cache_bytes(facts: ModelFacts, iterations: int, scale_frames: int, special_cap: int) -> int:
    """float32 K/V of every camera-head iteration and block for scale + special_cap frames and
    the streamed one (engine/models/camera_head.py `CameraCache`)."""
    return int(iterations * facts.camera_depth * 2 * (scale_frames + special_cap + 1)
               * facts.camera_heads * facts.camera_head_dim * 4)


def workspace_bytes(facts: ModelFacts, patch_tokens: int, scale_frames: int) -> int:
    tokens = patch_tokens + facts.special_tokens
    scale_step = WORKSPACE_SCALE_FIXED_BYTES + WORKSPACE_BYTES_PER_SCALE_TOKEN * scale_frames * tokens
    streamed = WORKSPACE_STEP_FIXED_BYTES + WORKSPACE_BYTES_PER_FRAME_TOKEN * tokens
    return int(facts.compute_bytes / 2 * max(scale_step, streamed))


def step_graph_bytes(facts: ModelFacts, patch_tokens: int, weight_dtype: str = "auto") -> int:
    """The whole-step CUDA graph's private pool: one streamed step's activations, the per-token
    part of the streamed workspace (part of `workspace_bytes`, see the module docstring); 0 for
    quantized weights, which run eagerly."""
    if weight_dtype in ("int8", "fp8"):
        return 0
    return int(facts.compute_bytes / 2 * WORKSPACE_BYTES_PER_FRAME_TOKEN * (patch_tokens + facts.special_tokens))


def headroom_bytes(budget: int) -> int:
    return int(HEADROOM_BYTES + HEADROOM_FRACTION * budget)


def patch_tokens_for(facts: ModelFacts, width: int, height: Optional[int] = None) -> int:
    """Patch tokens of a frame at model width `width` (height: the 518x378 aspect when unknown)."""
    if height is None:
        height = max(facts.patch_size, round(width * 378 / 518 / facts.patch_size) * facts.patch_size)
    return (height // facts.patch_size) * (width // facts.patch_size)


# ------------------------------------------------------------------ plans
@dataclass
class MemoryPlan:
    """The settings chosen for a budget, what each block takes and why."""

    budget_bytes: int
    window: int
    kv_dtype: str
    weight_dtype: str
    kv_compression: str
    kv_keep_ratio: float
    tier: int                      # 1 = the configured settings, larger = further from them
    order: int                     # position in the walk of candidates (0 = the configured settings)
    exact: bool                    # compute-dtype KV and weights, no compression, configured window
    patch_tokens: int
    breakdown: dict                # bytes: weights, kv_pool, camera_cache, workspace
    reasons: list = field(default_factory=list)
    step_graph: int = 0            # bytes of the workspace the whole-step graph's pool takes

    @property
    def predicted_peak_bytes(self) -> int:
        return int(sum(self.breakdown.values()))

    def settings(self) -> dict:
        return {"window": self.window, "kv_dtype": self.kv_dtype, "weight_dtype": self.weight_dtype,
                "kv_compression": self.kv_compression, "kv_keep_ratio": self.kv_keep_ratio}

    def quality(self) -> tuple:
        """Smaller = closer to the configured settings (the walk's order: tier, then window)."""
        return self.order

    def as_dict(self) -> dict:
        return {"budget_gib": self.budget_bytes / GIB, "predicted_peak_gib": self.predicted_peak_bytes / GIB,
                "headroom_gib": headroom_bytes(self.budget_bytes) / GIB,
                **self.settings(), "tier": self.tier, "exact": self.exact, "patch_tokens": self.patch_tokens,
                "breakdown_gib": {k: v / GIB for k, v in self.breakdown.items()},
                "step_graph_gib": self.step_graph / GIB, "reasons": list(self.reasons)}

    def describe(self) -> str:
        """One line for the settings panel and logs."""
        kind = "exact path" if self.exact else f"plan tier {self.tier}"
        comp = "" if self.kv_compression == "none" else f", {self.kv_compression} keep {self.kv_keep_ratio:g}"
        return (f"{kind}: window {self.window}, KV {self.kv_dtype}, weights {self.weight_dtype}{comp} -- "
                f"{self.predicted_peak_bytes / GIB:.2f} of {self.budget_bytes / GIB:.2f} GiB")


def explicit_fields(cfg: SessionConfig) -> frozenset:
    """The planned fields whose value is not the default: the user's choices, never changed."""
    defaults = SessionConfig()
    return frozenset(n for n in PLANNED if getattr(cfg, n) != getattr(defaults, n))


def _resolved_kv(cfg_dtype: str, kv_dtype: str) -> str:
    return cfg_dtype if kv_dtype in ("auto", None) else kv_dtype


def _predict(facts: ModelFacts, cfg: SessionConfig, patch_tokens: int, window: int, kv_dtype: str,
             weight_dtype: str, compression: str, keep: float) -> dict:
    from .kv.compression import make_compressor
    from .kv.dtypes import QUANTIZED, parse_dtype
    import torch
    kv = _resolved_kv(cfg.dtype, kv_dtype)
    storage = parse_dtype(kv, allow_quantized=True)
    kind = next((k for k, v in QUANTIZED.items() if v == storage), "native")
    comp = make_compressor(compression, keep, cfg.kv_block_size, cfg.kv_seed)
    keep_tokens = comp.keep_tokens(patch_tokens) if comp.stores_fewer else None
    return {
        "weights": facts.weights(weight_dtype),
        "kv_pool": kv_pool_bytes(facts, patch_tokens, scale_frames=cfg.scale_frames, window=window,
                                 special_cap=max(cfg.special_cap, cfg.scale_frames + window),
                                 kv_bytes=torch.empty((), dtype=storage).element_size(), kv_kind=kind,
                                 keep_tokens=keep_tokens),
        "camera_cache": camera_cache_bytes(facts, cfg.camera_iterations, cfg.scale_frames, cfg.special_cap),
        "workspace": workspace_bytes(facts, patch_tokens, cfg.scale_frames),
        "kv_scratch": kv_scratch_bytes(facts, patch_tokens, kind, scale_frames=cfg.scale_frames, window=window,
                                       special_cap=max(cfg.special_cap, cfg.scale_frames + window),
                                       keep_tokens=keep_tokens),
    }


def plan_memory(cfg: SessionConfig, budget_gib: float, facts: ModelFacts, *, patch_tokens: Optional[int] = None,
                explicit: Optional[frozenset] = None, fixed_weights: Optional[str] = None) -> MemoryPlan:
    """The plan for `cfg` within `budget_gib` (see the module docstring); MemoryPlanError when
    nothing fits. `explicit`: planned fields never changed (default `explicit_fields(cfg)`);
    `fixed_weights`: the weight dtype already applied to the model (a re-plan at the first frame)."""
    budget = int(float(budget_gib) * GIB)
    if budget <= 0:
        raise MemoryPlanError(f"gpu_memory must be a positive budget in GiB (got {budget_gib})")
    explicit = explicit_fields(cfg) if explicit is None else frozenset(explicit)
    tokens = patch_tokens or patch_tokens_for(facts, cfg.image_width)
    room = budget - headroom_bytes(budget)
    w0 = int(cfg.window)
    kv0 = cfg.kv_dtype
    wd0 = fixed_weights or cfg.weight_dtype
    # (tier, kv_dtype, weight_dtype, compression, keep, lowest window, why)
    tiers = [(1, kv0, wd0, cfg.kv_compression, cfg.kv_keep_ratio, w0, "the configured settings fit")]
    native = _resolved_kv(cfg.dtype, kv0) == cfg.dtype and cfg.kv_compression == "none"
    tiers.append((2, kv0, wd0, cfg.kv_compression, cfg.kv_keep_ratio, FAST_MIN_WINDOW if native else MIN_WINDOW,
                  "a shorter window keeps exact arithmetic and the fixed-shape attention + CUDA graphs"))
    tiers.append((3, "fp8", wd0, cfg.kv_compression, cfg.kv_keep_ratio, MIN_WINDOW,
                  "fp8 KV halves the pool (attention reads it back in the compute dtype: slower than the exact path)"))
    tiers.append((4, "fp8", "int8", cfg.kv_compression, cfg.kv_keep_ratio, MIN_WINDOW,
                  "int8 trunk weights save about half the trunk (eager: no CUDA graphs)"))
    for keep in (0.5, 0.25):
        tiers.append((5, "fp8", "int8", "token_partition", keep, MIN_WINDOW,
                      f"token_partition keeps {keep:g} of each window frame's tokens"))
    refusals = []
    order = -1
    for tier, kvd, wd, comp, keep, wmin, why in tiers:
        changed = {"kv_dtype": kvd != kv0, "weight_dtype": wd != wd0,
                   "kv_compression": comp != cfg.kv_compression,
                   "kv_keep_ratio": keep != cfg.kv_keep_ratio and comp != "none"}
        blocked = [n for n, c in changed.items() if c and n in explicit]
        if fixed_weights and wd != fixed_weights:
            blocked.append("weight_dtype (already applied to the model)")
        if blocked:
            refusals.append(f"tier {tier} would change {', '.join(blocked)}")
            continue
        windows = [w0] if ("window" in explicit or tier == 1) else range(w0, min(wmin, w0) - 1, -1)
        for w in windows:
            order += 1
            parts = _predict(facts, cfg, tokens, w, kvd, wd, comp, keep)
            if sum(parts.values()) <= room:
                exact = tier == 1 and native and wd in ("auto", "bf16", cfg.dtype)
                reasons = [why if tier == 1 else f"tier {tier}: {why}"]
                if w != w0:
                    reasons.append(f"window lowered from {w0} to {w}: the largest that fits")
                if kvd != kv0:
                    reasons.append(f"kv_dtype {kvd} instead of {kv0}")
                if wd != wd0:
                    reasons.append(f"weight_dtype {wd} instead of {wd0}")
                if comp != cfg.kv_compression:
                    reasons.append(f"kv_compression {comp} keep {keep:g}")
                if tier > 1:
                    exact_need = sum(_predict(facts, cfg, tokens, w0, kv0, wd0, cfg.kv_compression,
                                              cfg.kv_keep_ratio).values())
                    reasons.append(f"the configured settings need {exact_need / GIB:.2f} GiB + "
                                   f"{headroom_bytes(budget) / GIB:.2f} headroom; budget {budget / GIB:.2f} GiB")
                return MemoryPlan(budget, w, kvd, wd, comp, keep, tier, order, exact, tokens, parts, reasons,
                                  step_graph_bytes(facts, tokens, wd))
    need = sum(_predict(facts, cfg, tokens, w0, kv0, wd0, cfg.kv_compression, cfg.kv_keep_ratio).values())
    least = sum(_predict(facts, cfg, tokens, MIN_WINDOW, "fp8", "int8", "token_partition", 0.25).values())
    mine = ", ".join(f"{n}={getattr(cfg, n)!r}" for n in PLANNED if n in explicit)
    msg = (f"not enough GPU memory: the budget is {budget / GIB:.2f} GiB ({headroom_bytes(budget) / GIB:.2f} "
           f"kept as headroom); these settings need {need / GIB:.2f} GiB at {tokens} patch tokens per frame")
    if mine:
        msg += f"; your settings {mine} are kept as chosen ({'; '.join(refusals) or 'no smaller plan'})"
        msg += "; reset them to their defaults to let the plan pick smaller ones"
    else:
        msg += f"; the smallest plan (window {MIN_WINDOW}, fp8 KV, int8 weights, token_partition 0.25) needs {least / GIB:.2f} GiB"
    msg += "; lower image_width or scale_frames, or free GPU memory"
    raise MemoryPlanError(msg)


# ------------------------------------------------------------------ sessions
def device_budget_gib(device) -> float:
    """Default budget: what the device has free plus what this process's allocator already holds
    (the model's weights may be there already)."""
    import torch
    free, _total = torch.cuda.mem_get_info(device)
    return (free + torch.cuda.memory_reserved(device)) / GIB


def session_plan(cfg: SessionConfig, model, device, *, patch_tokens: Optional[int] = None,
                 fixed_weights: Optional[str] = None, explicit: Optional[frozenset] = None) -> Optional[MemoryPlan]:
    """The plan a LingBot-Map session applies, or None when it plans nothing (CPU without a
    budget). gpu_memory 0 = the device's free memory (CUDA)."""
    budget = float(cfg.gpu_memory or 0)
    if budget <= 0:
        if getattr(device, "type", str(device)) != "cuda":
            return None
        budget = device_budget_gib(device)
    facts = model_facts(model, cfg.dtype) if model is not None else facts_for_name(cfg.model, cfg.dtype)
    return plan_memory(cfg, budget, facts, patch_tokens=patch_tokens, explicit=explicit,
                       fixed_weights=fixed_weights)


def apply_plan(cfg: SessionConfig, plan: Optional[MemoryPlan]) -> SessionConfig:
    """`cfg` with the plan's settings (the config the session then runs)."""
    if plan is None:
        return cfg
    s = plan.settings()
    if cfg.special_cap < cfg.scale_frames + s["window"]:
        s["special_cap"] = cfg.scale_frames + s["window"]
    return dataclasses.replace(cfg, **s)


def preview(cfg: SessionConfig) -> str:
    """One line for a settings view: the plan `cfg` would run with, the refusal, or why no plan
    applies ("" for engines without one). Never raises."""
    if cfg.engine != "lingbot-map":
        return ""
    try:
        budget = float(cfg.gpu_memory or 0)
        if budget <= 0:
            import torch
            if not str(cfg.device).startswith("cuda") or not torch.cuda.is_available():
                return "Memory plan: none (set a GPU memory budget, or run on CUDA)"
            budget = device_budget_gib(torch.device(cfg.device))
        return "Memory plan: " + plan_memory(cfg, budget, facts_for_name(cfg.model, cfg.dtype)).describe()
    except EngineError as exc:
        return f"Memory plan: {exc}"
    except Exception as exc:            # a preview never breaks the settings view
        return f"Memory plan: unavailable ({type(exc).__name__}: {exc})"
