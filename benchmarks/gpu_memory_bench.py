"""Memory plans on a capped GPU (issue 26 item 3): long LingBot-Map streams under a per-process
memory cap, with the settings the plan (engine/memory_plan.py) picks for that cap.

    python -m benchmarks.gpu_memory_bench --cap 8 --frames 10000 --json $OUT/mem8.json
    python -m benchmarks.gpu_memory_bench --calibrate --json $OUT/calib.json

A run: `torch.cuda.set_per_process_memory_fraction` caps the caching allocator at `--cap` GiB
before anything is allocated; a session opens with `gpu_memory=cap` (the plan's budget) and
streams `--frames` synthetic frames (seeded, at model resolution, cycled as `reconstudio bench`
does); it reports steady FPS, latency, peak allocated / reserved every `--row` frames, the plan
(settings, predicted peak, reasons) and whether an out-of-memory error happened. Then the cap is
lifted and the exact path (same seeded weights and frames, no budget) runs the first
`--ref-frames` frames: the plan's deviation from it, pose encoding (relative norm) and depth
(median per-pixel relative error), the metric of benchmarks/side_by_side.py. With random weights
the deviation is a numerical figure, not an accuracy figure.

`--calibrate`: short uncapped streams at a few scale-frame counts, widths and windows, measured
peak against the plan's predicted peak (how the workspace constants of engine/memory_plan.py are
checked).
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np
import torch

from engine import SessionConfig, open_session
from engine.bench import BenchConfig, build_bench_model, height_for_width

GIB = 2 ** 30


def _frames(width: int, n: int = 16, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    h = height_for_width(width)
    return [torch.rand(3, h, width, generator=gen) for _ in range(n)]


def _model(args, seed: int = 0):
    return build_bench_model(BenchConfig(model=args.model, weights=args.weights, seed=seed, device=args.device))


def _config(args, **kw) -> SessionConfig:
    return SessionConfig(engine="lingbot-map", model=args.model, device=args.device, dtype=args.dtype,
                         image_width=args.width, **kw)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _mem(dev, what: str):
    if dev.type != "cuda":
        return None
    return {"peak_allocated": torch.cuda.max_memory_allocated, "peak_reserved": torch.cuda.max_memory_reserved,
            "allocated": torch.cuda.memory_allocated}[what](dev) / GIB


def _pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1e3, q)) if len(xs) else None


def stream(session, frames: list, n: int, keep: int, row: int, warmup: int = 30,
           max_seconds: float = 0.0) -> dict:
    """Push n frames; timing per push, rows of memory every `row` results, outputs of the first
    `keep` results (pose_enc, depth subsampled 4x)."""
    dev = session.device
    _sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    lat, rows, kept = [], [], {}
    done, t0, t_steady, n_steady = 0, time.perf_counter(), None, 0
    scale = session.config.scale_frames
    seg_t, seg_n = t0, 0
    scale_peak = None                      # (allocated, reserved) peaks up to the end of the scale phase

    def take(results):
        for r in results:
            if r.index < keep:
                kept[r.index] = (np.asarray(r.pose_enc, np.float64), np.asarray(r.depth[::4, ::4], np.float64))

    for i in range(n):
        if max_seconds and i > keep and time.perf_counter() - t0 > max_seconds:
            break                          # the call's time is up: the frames done are reported
        if i == scale and dev.type == "cuda":
            # every allocation of the scale step is queued by now (the allocator counts at the
            # call, not when the GPU runs it): its peak apart from the streamed steps' -- the two
            # workspace terms of engine/memory_plan.py are calibrated separately
            scale_peak = (_mem(dev, "peak_allocated"), _mem(dev, "peak_reserved"))
            torch.cuda.reset_peak_memory_stats(dev)
        t = time.perf_counter()
        out = session.push(frames[i % len(frames)])
        dt = time.perf_counter() - t
        take(out)
        done += len(out)
        if len(out) == 1:
            lat.append(dt)
        if done - scale == warmup and t_steady is None:
            t_steady = time.perf_counter()
        elif t_steady is not None:
            n_steady += len(out)
        if row and done and done // row > len(rows):
            now = time.perf_counter()
            rows.append({"frames": done, "seconds": now - t0, "segment_fps": (done - seg_n) / (now - seg_t),
                         "peak_allocated_gib": _mem(dev, "peak_allocated"),
                         "peak_reserved_gib": _mem(dev, "peak_reserved"), "allocated_gib": _mem(dev, "allocated")})
            print(f"  {done:6d} frames {now - t0:7.1f} s  segment {rows[-1]['segment_fps']:6.2f} fps  "
                  f"peak alloc {rows[-1]['peak_allocated_gib']}  reserved {rows[-1]['peak_reserved_gib']}",
                  flush=True)
            seg_t, seg_n = now, done
    out = session.flush()                  # the last streamed frame's results (deferred on CUDA)
    take(out)
    done += len(out)
    _sync(dev)
    t_end = time.perf_counter()
    streamed = (_mem(dev, "peak_allocated"), _mem(dev, "peak_reserved"))
    peaks = {"peak_allocated_gib": streamed[0], "peak_reserved_gib": streamed[1]}
    if scale_peak is not None:
        peaks = {"peak_allocated_gib": max(scale_peak[0], streamed[0]),
                 "peak_reserved_gib": max(scale_peak[1], streamed[1]),
                 "peak_scale_phase_gib": scale_peak[0], "peak_streamed_gib": streamed[0]}
    return {"frames": done, "seconds": t_end - t0,
            "fps_steady": n_steady / (t_end - t_steady) if t_steady and n_steady else None,
            "latency_p50_ms": _pct(lat[warmup:] or lat, 50), "latency_p95_ms": _pct(lat[warmup:] or lat, 95),
            **peaks, "rows": rows, "kept": kept}


def snapshot_summary(dev, top: int = 12) -> dict:
    """What the caching allocator holds, by pool: reserved and live bytes of the ordinary pool
    and of the CUDA graphs' private pools, and the largest live blocks of the ordinary pool
    (what sits beside the weights, KV pool and camera cache)."""
    pools, blocks = {}, []
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", dev.index or 0) != (dev.index or 0):
            continue
        pid = tuple(seg.get("segment_pool_id") or (0, 0))
        name = "ordinary" if pid == (0, 0) else "graphs"
        p = pools.setdefault(name, {"reserved_gib": 0.0, "active_gib": 0.0, "segments": 0})
        p["reserved_gib"] += seg["total_size"] / GIB
        p["segments"] += 1
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                p["active_gib"] += b["size"] / GIB
                if name == "ordinary":
                    blocks.append(b["size"])
    sizes: dict = {}
    for b in blocks:
        if b >= 16 * 2**20:
            mib = round(b / 2**20, 1)
            sizes[mib] = sizes.get(mib, 0) + 1
    return {"pools": pools, "largest_ordinary_blocks_mib": [round(b / 2**20, 1) for b in sorted(blocks)[::-1][:top]],
            "ordinary_live_blocks_from_16_mib": {str(k): v for k, v in sorted(sizes.items(), reverse=True)}}


def deviation(test: dict, ref: dict) -> dict:
    idx = sorted(set(test) & set(ref))
    if not idx:
        return {}
    pa = np.stack([test[i][0] for i in idx])
    pb = np.stack([ref[i][0] for i in idx])
    da = np.stack([test[i][1] for i in idx])
    db = np.stack([ref[i][1] for i in idx])
    return {"frames": len(idx),
            "pose_enc_rel": float(np.linalg.norm(pa - pb) / max(np.linalg.norm(pb), 1e-30)),
            "depth_median_rel": float(np.median(np.abs(da - db) / np.maximum(np.abs(db), 1e-30)))}


def capped(args) -> dict:
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap * GIB / total), dev.index or 0)
    frames = _frames(args.width)
    res = {"cap_gib": args.cap, "width": args.width, "weights": args.weights, "model": args.model,
           "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__}
    model = _model(args)
    session = None
    try:
        session = open_session(_config(args, gpu_memory=args.cap), model=model)
        res["plan_at_open"] = session.memory_plan.as_dict()
        run = stream(session, frames, args.frames, args.ref_frames, args.row, max_seconds=args.max_seconds)
        res["oom"] = None
    except Exception as exc:            # an out-of-memory error is a result here, not a crash
        res["oom"] = f"{type(exc).__name__}: {exc}"
        run = None
        print("FAILED:", res["oom"], flush=True)
    if session is not None:
        st = session.stats()
        res["memory_plan"] = st.get("memory_plan")
        res["kv_backend"] = (st.get("kv") or {}).get("backend")
        res["step_graph"] = st.get("step_graph")
        if cuda:
            res["allocator_at_end"] = snapshot_summary(dev)
        session.close()
    kept = run.pop("kept") if run else {}
    res["run"] = run
    if run and cuda:
        pred = res["memory_plan"]["predicted_peak_gib"]
        res["predicted_vs_measured_gib"] = {"predicted": pred, "measured": run["peak_allocated_gib"],
                                           "error": run["peak_allocated_gib"] - pred}
    del session, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, dev.index or 0)
    if args.ref_frames and kept:
        model = _model(args)
        ref_s = open_session(_config(args), model=model)
        ref = stream(ref_s, frames, args.ref_frames, args.ref_frames, 0)
        res["reference"] = {"memory_plan": ref_s.stats().get("memory_plan"), "fps_steady": ref["fps_steady"],
                            "peak_allocated_gib": ref["peak_allocated_gib"]}
        res["deviation_from_exact"] = deviation(kept, ref["kept"])
        ref_s.close()
    return res


def calibrate(args) -> dict:
    """Measured peak against the plan's prediction for a few shapes (uncapped, exact plans)."""
    model = _model(args)
    rows = []
    for scale, width, window, kv in ((8, 518, 64, "auto"), (4, 518, 64, "auto"), (16, 518, 64, "auto"),
                                     (8, 518, 16, "auto"), (8, 392, 64, "auto"), (8, 518, 32, "auto")):
        torch.cuda.empty_cache()
        s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", image_width=width,
                                       scale_frames=scale, window=window, kv_dtype=kv), model=model)
        r = stream(s, _frames(width), scale + 60, 0, 0, warmup=10)
        plan = s.stats()["memory_plan"]
        rows.append({"scale_frames": scale, "width": width, "window": window, "kv_dtype": kv,
                     "predicted_gib": plan["predicted_peak_gib"], "breakdown_gib": plan["breakdown_gib"],
                     "measured_peak_allocated_gib": r["peak_allocated_gib"],
                     "measured_peak_reserved_gib": r["peak_reserved_gib"],
                     "measured_peak_scale_phase_gib": r.get("peak_scale_phase_gib"),
                     "measured_peak_streamed_gib": r.get("peak_streamed_gib"), "fps_steady": r["fps_steady"]})
        print(json.dumps(rows[-1]), flush=True)
        s.close()
        del s
        gc.collect()
    return {"calibration": rows, "device_name": torch.cuda.get_device_name(0)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=float, default=8.0, help="per-process GPU memory cap and plan budget, GiB")
    ap.add_argument("--frames", type=int, default=10000)
    ap.add_argument("--ref-frames", type=int, default=200, help="frames compared with the exact path")
    ap.add_argument("--row", type=int, default=1000, help="a memory row every N frames")
    ap.add_argument("--max-seconds", type=float, default=0.0, help="stop streaming after this long (0 = never)")
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--weights", default="random", help="random | recipe | a checkpoint path")
    ap.add_argument("--model", default="lingbot-map", help="architecture (lingbot-map-tiny: a CPU check)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    res = calibrate(args) if args.calibrate else capped(args)
    text = json.dumps(res, indent=1, default=str)
    print(text if args.calibrate else json.dumps({k: v for k, v in res.items() if k != "run"} | {
        "run": {k: v for k, v in (res.get("run") or {}).items() if k != "rows"}}, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
