"""Benchmark of the streaming LingBot-Map engine: FPS, latency, GPU memory, per-part time.

Drives a real session (`open_session(SessionConfig(engine="lingbot-map", ...), model=...)`) with
synthetic frames already at model resolution, so what is measured is the engine (model, KV cache,
camera cache, result conversion), not video decoding. Weights:

* ``random``: every tensor drawn on the device with the scale of the fixtures' recipe
  (LayerNorm ~1, Linear/Conv ~N(0, 1/fan_in), biases ~0.02, LayerScale ~0.2): seconds to build,
  the same arithmetic as real weights (all-zero weights would run faster than real ones);
* ``recipe``: the fixtures' deterministic recipe (engine.models.recipe; slow at full size on CPU);
* a path: a checkpoint loaded with engine.load_checkpoint.

Timing: each push is timed on the host (the session synchronises CUDA at the end of a push).
With ``breakdown=True`` the model's section hooks and the KV cache's attend hook are timed with
CUDA events (perf_counter on CPU): patch embed, frame blocks, global blocks (of which global
attention = the paged-cache attend), camera head, depth head. The events cost a little, so
FPS figures come from runs without breakdown.

Memory: peak GPU allocated / reserved (torch.cuda) since the stream started, and the process RSS.
A sweep (``sweep=[64, 1000, ...]``) runs one stream to the largest count and records a row at
each count: that is how "memory stays flat from 1,000 to 10,000 frames" is checked.
"""
from __future__ import annotations

import contextlib
import csv
import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .api import EngineError, SessionConfig

DEPTH_STRIDE = 4       # `keep_outputs`: every 4th depth pixel each way (deviations, not pictures)
PARTS = ("patch_embed", "frame_blocks", "global_blocks", "global_attention", "camera_head", "depth_head")
SWEEP_COLUMNS = ("frames", "seconds", "fps", "segment_fps", "latency_p50_ms", "latency_p95_ms",
                 "peak_allocated_gib", "peak_reserved_gib", "allocated_gib", "rss_gib",
                 "kv_pages_used", "kv_cached_frames", "kv_special_frames", "kv_bytes", "time_index")


@dataclass
class BenchConfig:
    model: str = "lingbot-map"          # engine.models name ("lingbot-map-tiny" for tests)
    weights: str = "random"             # "random" | "recipe" | checkpoint path
    width: int = 518
    height: int = 378
    frames: int = 300
    warmup: int = 30                    # streamed frames left out of the steady-state figures
    window: int = 64
    scale_frames: int = 8
    keyframe_interval: int = 1
    camera_iterations: int = 4
    special_cap: int = 1024
    dtype: str = "bf16"
    kv_dtype: str = "auto"
    backend: str = "auto"
    device: str = "cuda"
    breakdown: bool = False
    sweep: list = field(default_factory=list)   # frame counts at which to record a row
    seed: int = 0
    distinct_frames: int = 16           # synthetic frames cycled through
    cuda_graphs: Optional[bool] = None  # None = the session's default
    settings: dict = field(default_factory=dict)  # further SessionConfig fields (kv_compression, ...)
    keep_outputs: bool = False          # keep every frame's pose_enc and a strided depth (`outputs`)


def height_for_width(width: int) -> int:
    """Model height keeping the 518x378 aspect (37x27 patches), a multiple of 14."""
    return max(14, round(width * 378 / 518 / 14) * 14)


# ------------------------------------------------------------------ weights
def build_bench_model(cfg: BenchConfig):
    from .model_zoo import build_model
    from .models.recipe import random_init_
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineError("bench: device 'cuda' was asked for but no CUDA GPU is available; use --device cpu")
    with torch.device(dev):
        model = build_model(cfg.model)
    if cfg.weights == "random":
        random_init_(model, cfg.seed)
    elif cfg.weights == "recipe":
        from .models.recipe import fill_recipe
        fill_recipe(model)
    else:
        from .checkpoint import load_checkpoint
        load_checkpoint(model, cfg.weights)
    return model


# ------------------------------------------------------------------ timing
class SectionTimer:
    """`timer(name)` context manager for the model's named sections (`engine.models.sections.timing`);
    CUDA events or perf_counter."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.enabled = True
        self._pending: list = []
        self.totals: dict = defaultdict(float)    # seconds

    @contextlib.contextmanager
    def __call__(self, name: str):
        if not self.enabled:
            yield
            return
        if self.cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self._pending.append((name, a, b))
        else:
            t0 = time.perf_counter()
            yield
            self.totals[name] += time.perf_counter() - t0

    def collect(self) -> None:
        """Fold finished CUDA events into the totals (call after a synchronise)."""
        for name, a, b in self._pending:
            self.totals[name] += a.elapsed_time(b) / 1e3
        self._pending.clear()

    def reset(self) -> None:
        self._pending.clear()
        self.totals.clear()


def _rss_gib() -> Optional[float]:
    try:
        import psutil
        return psutil.Process().memory_info().rss / 2**30
    except Exception:
        return None


def _pct(xs, q) -> Optional[float]:
    return float(np.percentile(np.asarray(xs) * 1e3, q)) if len(xs) else None


# ------------------------------------------------------------------ run
def run_bench(cfg: BenchConfig, model=None, log: Callable[[str], None] = print,
              on_row: Optional[Callable[[dict], None]] = None) -> dict:
    """Stream `cfg.frames` (or max(sweep)) synthetic frames through a lingbot-map session.
    `on_row` gets each sweep row as soon as it is measured (so a killed run keeps its rows)."""
    from . import open_session
    from .kv.backends import flashinfer_available

    if cfg.width % 14 or cfg.height % 14:
        raise EngineError(f"bench: resolution {cfg.width}x{cfg.height} must be multiples of 14")
    sweep = sorted({int(n) for n in cfg.sweep if int(n) > 0})
    total = max([cfg.frames] + sweep) if sweep else cfg.frames
    if total < cfg.scale_frames:
        raise EngineError(f"bench: --frames ({total}) must be at least --scale-frames ({cfg.scale_frames})")
    dev = torch.device(cfg.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(cfg.seed)

    t_build = time.perf_counter()
    if model is None:
        model = build_bench_model(cfg)
    build_s = time.perf_counter() - t_build
    session = open_session(SessionConfig(
        engine="lingbot-map", device=cfg.device, dtype=cfg.dtype, kv_dtype=cfg.kv_dtype,
        backend=cfg.backend, image_width=cfg.width, scale_frames=cfg.scale_frames, window=cfg.window,
        keyframe_interval=cfg.keyframe_interval, camera_iterations=cfg.camera_iterations,
        special_cap=cfg.special_cap,
        **({} if cfg.cuda_graphs is None else {"cuda_graphs": bool(cfg.cuda_graphs)}),
        **cfg.settings), model=model)

    gen = torch.Generator().manual_seed(cfg.seed)
    frames = [torch.rand(3, cfg.height, cfg.width, generator=gen) for _ in range(max(1, cfg.distinct_frames))]
    timer = SectionTimer(cuda) if cfg.breakdown else None
    if cuda:
        torch.cuda.synchronize(dev)
        weights_gib = torch.cuda.memory_allocated(dev) / 2**30
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        weights_gib = None

    lat: list = []                 # seconds per push that returned results (streamed frames)
    done = 0                       # results received
    t0 = time.perf_counter()
    t_steady = None
    steady_frames = 0
    rows: list = []
    seg_start_t, seg_start_n, seg_lat = t0, 0, []
    next_sweep = 0
    timed = _TimedSession(session, timer, cuda)

    outputs: dict = {}             # index -> (pose_enc, depth[::DEPTH_STRIDE, ::DEPTH_STRIDE])

    def keep(results):
        for r in results:
            d = r.depth[::DEPTH_STRIDE, ::DEPTH_STRIDE].copy() if r.depth is not None else None
            outputs[r.index] = (None if r.pose_enc is None else np.array(r.pose_enc, np.float64), d)

    def on_results(results):
        nonlocal done, t_steady, steady_frames, seg_start_t, seg_start_n, seg_lat, next_sweep
        dt = timed.dt
        done += len(results)
        if cfg.keep_outputs:
            keep(results)
        if len(results) == 1:
            lat.append(dt)
            seg_lat.append(dt)
        streamed = done - cfg.scale_frames
        if streamed == cfg.warmup:          # steady state starts after the warm-up frames
            t_steady = time.perf_counter()
            if timer is not None:
                timer.reset()
        elif streamed > cfg.warmup:
            steady_frames += len(results)
        while next_sweep < len(sweep) and done >= sweep[next_sweep]:
            now = time.perf_counter()
            st = session.stats()
            kv = st.get("kv") or {}
            rows.append({
                "frames": done, "seconds": now - t0, "fps": done / (now - t0),
                "segment_fps": (done - seg_start_n) / (now - seg_start_t),
                "latency_p50_ms": _pct(seg_lat, 50), "latency_p95_ms": _pct(seg_lat, 95),
                "peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None,
                "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2**30 if cuda else None,
                "allocated_gib": torch.cuda.memory_allocated(dev) / 2**30 if cuda else None,
                "rss_gib": _rss_gib(),
                "kv_pages_used": kv.get("pages_total", 0) - kv.get("pages_free", 0),
                "kv_cached_frames": kv.get("cached_frames"), "kv_special_frames": kv.get("special_frames"),
                "kv_bytes": kv.get("bytes_allocated"), "time_index": st.get("time_index"),
            })
            log("  {frames:>6d} frames  {seconds:8.1f} s  {fps:6.2f} fps (segment {segment_fps:6.2f})  "
                "peak alloc {pa}  reserved {pr}  kv pages {kv_pages_used}".format(
                    **rows[-1], pa=_gib(rows[-1]["peak_allocated_gib"]), pr=_gib(rows[-1]["peak_reserved_gib"])))
            if on_row is not None:
                on_row(rows[-1])
            seg_start_t, seg_start_n, seg_lat = now, done, []
            next_sweep += 1

    # the one run loop (engine.run_driver) pushes the frames; the session is flushed below
    from .run_driver import CallbackSink, RunDriver, SequenceSource
    RunDriver(SequenceSource(range(total), load=lambda i: frames[i % len(frames)]), timed,
              [CallbackSink(results=on_results)], stats_hz=0, flush=False).run()
    last = session.flush()
    if cfg.keep_outputs:               # kept; counted below, not timed
        keep(last)
    done += len(last)
    t_end = time.perf_counter()
    st = session.stats()

    res = {
        "config": asdict(cfg),
        "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "torch": torch.__version__,
        "flashinfer_available": flashinfer_available(),
        "kv_backend": (st.get("kv") or {}).get("backend"),
        "model_build_s": build_s,
        "frames": done,
        "seconds": t_end - t0,
        "fps_overall": done / (t_end - t0),
        "fps_steady": steady_frames / (t_end - t_steady) if t_steady and steady_frames else None,
        "steady_frames": steady_frames,
        "latency_p50_ms": _pct(lat[cfg.warmup:] or lat, 50),
        "latency_p95_ms": _pct(lat[cfg.warmup:] or lat, 95),
        "weights_gib": weights_gib,
        "peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2**30 if cuda else None,
        "rss_gib": _rss_gib(),
        "kv": st.get("kv"),
        "camera_cache": st.get("camera_cache"),
        # graphs / attention path of the settings, or why they leave the fast path (engine/fast_path.py)
        "fast_path": st.get("fast_path"),
        "step_graph": st.get("step_graph"),
        # the streamed frames while the window fills (after the first), timed per push
        "fps_filling": (len(lat[1:cfg.window]) / sum(lat[1:cfg.window])) if len(lat) > 1 else None,
        "sweep": rows,
    }
    if cfg.keep_outputs:
        res["outputs"] = outputs
    if timer is not None and steady_frames:
        per = {k: 1e3 * v / steady_frames for k, v in timer.totals.items()}
        res["breakdown_ms_per_frame"] = {k: per.get(k) for k in PARTS if k in per}
        res["breakdown_total_ms_per_frame"] = 1e3 * (t_end - t_steady) / steady_frames
    session.close()
    return res


class _TimedSession:
    """The bench's session as the run driver sees it: each push is timed on the host (`dt`) and,
    with a section timer, runs under `sections.timing(timer)` (CUDA events folded per push)."""

    def __init__(self, session, timer: Optional[SectionTimer], cuda: bool):
        self.session, self.timer, self.cuda = session, timer, cuda
        self.dt = 0.0

    def push(self, frame, timestamp=None):
        from .models.sections import timing
        tp = time.perf_counter()
        with timing(self.timer):
            results = self.session.push(frame)
        self.dt = time.perf_counter() - tp
        if self.timer is not None and self.cuda:
            self.timer.collect()
        return results

    def __getattr__(self, name):
        return getattr(self.session, name)


def _gib(x) -> str:
    return "-" if x is None else f"{x:.2f} GiB"


def format_report(res: dict) -> str:
    c = res["config"]
    lines = [
        f"LingBot-Map bench: {c['model']} ({c['weights']} weights) on {res['device_name']}, "
        f"{c['width']}x{c['height']}, {c['dtype']} (kv {c['kv_dtype']}), backend {c['backend']} -> "
        f"{res['kv_backend']}, window {c['window']}, scale {c['scale_frames']}, keyframe interval "
        f"{c['keyframe_interval']}, camera iterations {c['camera_iterations']}",
        f"  frames {res['frames']} in {res['seconds']:.2f} s: overall {res['fps_overall']:.2f} FPS, "
        f"steady {res['fps_steady']:.2f} FPS over {res['steady_frames']} frames"
        if res["fps_steady"] else f"  frames {res['frames']} in {res['seconds']:.2f} s: overall "
                                  f"{res['fps_overall']:.2f} FPS (no steady-state frames after the warm-up)",
        f"  latency p50 {res['latency_p50_ms'] or float('nan'):.1f} ms, p95 {res['latency_p95_ms'] or float('nan'):.1f} ms",
        f"  GPU memory: weights {_gib(res['weights_gib'])}, peak allocated {_gib(res['peak_allocated_gib'])}, "
        f"peak reserved {_gib(res['peak_reserved_gib'])}; RSS {_gib(res['rss_gib'])}",
    ]
    kv = res.get("kv") or {}
    if kv:
        lines.append(f"  KV cache: {kv['pages_total']} pages x {kv['page_size']} tokens, "
                     f"{kv['bytes_allocated'] / 2**30:.2f} GiB, {kv['cached_frames']} frames cached, "
                     f"{kv['special_frames']} frames of specials, zero-copy {kv['zero_copy']}")
        if kv.get("compression", "none") != "none" or "bytes_kept" in kv:
            lines.append(f"  KV kept: {kv.get('compression', 'none')}, {kv.get('window_tokens_per_frame')} "
                         f"tokens per window frame, {kv.get('kept_tokens')} tokens = "
                         f"{kv.get('bytes_kept', 0) / 2**30:.3f} GiB ({kv['dtype']}, attention in "
                         f"{kv.get('attn_dtype')})")
    bd = res.get("breakdown_ms_per_frame")
    if bd:
        tot = res["breakdown_total_ms_per_frame"]
        lines.append(f"  breakdown (ms per steady frame, of {tot:.1f} ms; global attention is inside global blocks):")
        for k, v in bd.items():
            lines.append(f"    {k:18s} {v:8.2f}  {100 * v / tot:5.1f} %")
    return "\n".join(lines)


class CsvRows:
    """Sweep CSV written row by row (flushed), header first."""

    def __init__(self, path: str):
        self._f = open(path, "w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=list(SWEEP_COLUMNS))
        self._w.writeheader()
        self._f.flush()

    def __call__(self, row: dict) -> None:
        self._w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in SWEEP_COLUMNS})
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def write_csv(rows: list, path: str) -> None:
    out = CsvRows(path)
    for r in rows:
        out(r)
    out.close()


def write_json(res: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)


# ---------------------------------------------------------------------------------------------
# Every setting on the fast path (issue 26 item 2; docs/benchmarks.md "Every setting on the fast
# path"): each setting streamed over the same frames as the exact path, with its FPS, peak memory,
# graph mode / attention path (engine/fast_path.py) and deviation from the exact path.

def fast_path_settings(cfg: BenchConfig) -> dict:
    """name -> BenchConfig overrides of the settings table (the first, "exact", is the reference).
    Windowed mode restarts at half the stream so that one restart is inside it."""
    out = {"exact": {}}
    for method in ("token_partition", "random_subset", "token_merge", "block_sparse"):
        for keep in (0.5, 0.25):
            out[f"{method} {keep}"] = {"settings": {"kv_compression": method, "kv_keep_ratio": keep}}
    out.update({
        "kv fp8": {"kv_dtype": "fp8"},
        "kv int8": {"kv_dtype": "int8"},
        "keyframe interval 2": {"keyframe_interval": 2},
        f"window {max(2, cfg.window // 4)}": {"window": max(2, cfg.window // 4)},
        "windowed": {"settings": {"mode": "windowed", "window_size": max(cfg.scale_frames + 2, cfg.frames // 2),
                                  "overlap": max(1, min(4, cfg.scale_frames - 1))}},
        # quantized weights last: quantizing is in place (each gets a fresh model, same seed)
        "weights int8": {"settings": {"weight_dtype": "int8"}},
        "weights fp8": {"settings": {"weight_dtype": "fp8"}},
    })
    return out


def output_deviation(ref: dict, out: dict) -> dict:
    """Deviation of `out` from `ref` (run_bench `outputs`) over the frames both have: pose =
    relative L2 of the stacked pose encodings; depth = median over frames of the median relative
    depth difference where the reference depth is positive."""
    common = sorted(set(ref) & set(out))
    res = {"frames": len(common), "pose_rel": None, "depth_median_rel": None}
    pairs = [(ref[i][0], out[i][0]) for i in common if ref[i][0] is not None and out[i][0] is not None]
    if pairs:
        r = np.stack([a for a, _ in pairs])
        o = np.stack([b for _, b in pairs])
        res["pose_rel"] = float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-12))
    meds = []
    for i in common:
        a, b = ref[i][1], out[i][1]
        if a is None or b is None or a.shape != b.shape:
            continue
        ok = a > 0
        if ok.any():
            meds.append(float(np.median(np.abs(b[ok] - a[ok]) / a[ok])))
    if meds:
        res["depth_median_rel"] = float(np.median(meds))
    return res


def run_settings_table(cfg: BenchConfig, names: Optional[list] = None, log: Callable[[str], None] = print,
                       on_row: Optional[Callable[[dict], None]] = None) -> list:
    """Stream `cfg` once per setting of `fast_path_settings` (or the `names` given; "exact" always
    runs first), the same seed, frames and weights, and return a row per setting: steady FPS, FPS
    while the window fills, latency, peak GiB, the graph mode / attention / reason from stats()
    ("fast_path"), whole-step replays, and the deviation from the exact path. A setting that
    fails (e.g. torchao missing for quantized weights) gets a row with its error; the rest run.
    One model serves every setting but the quantized-weight ones (in-place quantization)."""
    from dataclasses import replace
    table = fast_path_settings(cfg)
    names = list(table) if not names else ["exact"] + [n for n in names if n != "exact"]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise EngineError(f"bench: unknown settings {unknown}; choose from {list(table)}")
    import gc
    cuda = torch.device(cfg.device).type == "cuda"
    model, rows, ref = None, [], None
    for name in names:
        over = dict(table[name])
        settings = dict(cfg.settings, **over.pop("settings", {}))
        run_cfg = replace(cfg, keep_outputs=True, settings=settings, sweep=[], breakdown=False, **over)
        quantized = settings.get("weight_dtype") in ("int8", "fp8")
        if quantized:
            model = None               # its own model (same seed): the shared one would count in its peak
        elif model is None:
            torch.manual_seed(cfg.seed)
            model = build_bench_model(cfg)
        gc.collect()
        if cuda:                       # the previous setting's cached blocks out of this one's reserved peak
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        try:
            res = run_bench(run_cfg, model=None if quantized else model, log=lambda *_: None)
        except Exception as exc:     # a setting that cannot run here: its row says why
            row = {"setting": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
        else:
            outputs = res.pop("outputs")
            if ref is None:
                ref = outputs
            kv = res.get("kv") or {}
            row = {"setting": name, "fps_steady": res["fps_steady"], "fps_filling": res["fps_filling"],
                   "latency_p50_ms": res["latency_p50_ms"], "latency_p95_ms": res["latency_p95_ms"],
                   "peak_allocated_gib": res["peak_allocated_gib"], "peak_reserved_gib": res["peak_reserved_gib"],
                   "kv_bytes": kv.get("bytes_allocated"), "backend": kv.get("backend"),
                   "fast_path": res.get("fast_path"), "step_graph": res.get("step_graph"),
                   "deviation": output_deviation(ref, outputs), "config": res["config"]}
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        log(format_settings_row(row))
        if on_row is not None:
            on_row(row)
    return rows


def format_settings_row(row: dict) -> str:
    if "error" in row:
        return f"{row['setting']:<24s} error: {row['error']}"
    fp, dev = row.get("fast_path") or {}, row["deviation"]

    def num(x, f):
        return format(x, f) if x is not None else "-"
    return (f"{row['setting']:<24s} {num(row['fps_steady'], '7.2f')} fps (filling {num(row['fps_filling'], '.1f')})  "
            f"p95 {num(row['latency_p95_ms'], '.1f')} ms  peak {num(row['peak_allocated_gib'], '.2f')} GiB  "
            f"graphs {fp.get('graphs')}  attention {fp.get('attention')}  "
            f"pose {num(dev['pose_rel'], '.2e')} depth {num(dev['depth_median_rel'], '.2e')}"
            + (f"\n{'':<24s} reason: {fp['reason']}" if fp.get("reason") else ""))
