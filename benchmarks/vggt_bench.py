"""Benchmark (not a test): VGGT-1B chunked session memory and speed, VGGT's offline pass, and
LingBot-Map in windowed mode, on one GPU. Prints one line per measurement and writes JSON.

    python3 benchmarks/vggt_bench.py --out out/vggt_bench.json            # H200, full size, bf16
    python3 benchmarks/vggt_bench.py --tiny --device cpu --frames 60      # smoke run of the script

VGGT runs at --width x --height (518x392); LingBot-Map windowed at --width x --windowed-height
(518x378, its benchmark default). The windowed phase writes a row at every window boundary, so each
row is one window's peak memory and FPS (the first row includes the warm-up). After the offline sizes, the script fits peak memory
(linear in frames) and time (quadratic) to them and prints the largest offline batch that would
fit in the GPU's memory with the time it would take: an extrapolation, labelled as such.

Weights: random with the fixtures' recipe statistics (drawn on the GPU, seeded; speed and memory
do not depend on the values). Frames: 32 distinct random images at the model resolution, cycled.
Each phase has a wall-clock budget: it stops at `--frames` or when its budget is spent, and the
JSON says how far it got. Peak memory is torch.cuda.max_memory_allocated, reset at every
checkpoint, so each figure is the peak over the frames since the previous checkpoint.
"""
from __future__ import annotations

import argparse
import json
import math
import time

from typing import Optional

import numpy as np
import torch


def fast_fill(model: torch.nn.Module, seed: int = 0) -> None:
    """The recipe's scaling (engine/models/recipe.py) on torch normals drawn on the model's device."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if not p.is_floating_point():
                continue
            z = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
            leaf = name.rsplit(".", 1)[-1]
            if leaf.endswith("weight") and p.dim() == 1:
                v = 1.0 + 0.05 * z
            elif leaf.endswith("weight"):
                v = z / math.sqrt(max(1, p[0].numel()))
            elif leaf.endswith("bias"):
                v = 0.02 * z
            elif leaf == "gamma":
                v = 0.2 + 0.02 * z
            else:
                v = z
            p.copy_(v)


def build(name: str, device: torch.device, dtype: torch.dtype):
    from engine import build_model
    with torch.device("meta"):
        m = build_model(name)
    m = m.to_empty(device=device)
    for mod in m.modules():                     # non-persistent buffers (ImageNet mean / std)
        for bname, buf in list(mod.named_buffers(recurse=False)):
            if bname in ("_mean", "_resnet_mean"):
                buf.copy_(torch.tensor((0.485, 0.456, 0.406), device=device).view(1, 3, 1, 1))
            elif bname in ("_std", "_resnet_std"):
                buf.copy_(torch.tensor((0.229, 0.224, 0.225), device=device).view(1, 3, 1, 1))
    fast_fill(m)
    return m.set_dtype(dtype).eval()


def frames(n: int, h: int, w: int):
    g = torch.Generator().manual_seed(0)
    base = torch.rand(n, 3, h // 8, w // 8, generator=g)
    return list(torch.nn.functional.interpolate(base, size=(h, w), mode="bilinear").clamp(0, 1))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def peak_reset(dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def peak(dev) -> float:
    return torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")


def stream(session, imgs, total: int, budget: float, checkpoints, dev, label: str, on_row=None) -> dict:
    """Push frames until `total` or the budget; per checkpoint: peak GiB since the previous one,
    frames/s over that stretch (results returned / wall time). `on_row(rows)` after every
    checkpoint, so a run killed at its time limit still leaves the rows so far on disk."""
    rows, done, results = [], 0, 0
    t0 = t_last = time.perf_counter()
    last_frames, last_results = 0, 0
    peak_reset(dev)
    cps = sorted(c for c in checkpoints if c <= total) + ([total] if total not in checkpoints else [])
    for cp in cps:
        while done < cp:
            results += len(session.push(imgs[done % len(imgs)]))
            done += 1
            if time.perf_counter() - t0 > budget:
                break
        sync(dev)
        now = time.perf_counter()
        st = session.stats()
        kv = st.get("kv") or {}
        row = {"frames": done, "peak_gib": round(peak(dev), 3),
               "fps": round((results - last_results) / max(now - t_last, 1e-9), 2),
               "kv_pages_used": (kv.get("pages_total", 0) - kv.get("pages_free", 0)) if kv else None,
               "segments": st.get("segments")}
        rows.append(row)
        print(f"[{label}] {json.dumps(row)}", flush=True)
        if on_row is not None:
            on_row(rows)
        t_last, last_results, last_frames = now, results, done
        peak_reset(dev)
        if now - t0 > budget:
            break
    results += len(session.flush())
    sync(dev)
    wall = time.perf_counter() - t0
    return {"rows": rows, "frames_pushed": done, "results": results, "wall_s": round(wall, 2),
            "fps_overall": round(results / wall, 2), "budget_hit": done < total}


def offline_fit(rows: list, dev) -> Optional[dict]:
    """Largest offline batch that would fit: peak GiB = a + b*n fitted to the measured sizes, time
    = c*n + d*n^2 (global attention is quadratic). An extrapolation, not a measurement."""
    ok = [r for r in rows if not r.get("oom")]
    if len(ok) < 2 or dev.type != "cuda":
        return None
    n = np.array([r["frames"] for r in ok], float)
    b, a = np.polyfit(n, [r["peak_gib"] for r in ok], 1)
    c, d = np.linalg.lstsq(np.stack([n, n ** 2], 1), np.array([r["wall_s"] for r in ok]), rcond=None)[0]
    total = torch.cuda.get_device_properties(dev).total_memory / 2**30
    n_fit = int((0.97 * total - a) / b) if b > 0 else None
    est = (c * n_fit + d * n_fit ** 2) if n_fit else None
    return {"gib_per_frame": round(float(b), 4), "gib_at_zero": round(float(a), 3), "gpu_total_gib": round(total, 1),
            "frames_that_fit_est": n_fit, "seconds_at_that_size_est": round(float(est), 1) if est else None,
            "fps_at_that_size_est": round(n_fit / float(est), 2) if est else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--backend", default="sdpa", help="attention backend of both sessions (sdpa needs no FlashInfer)")
    ap.add_argument("--tiny", action="store_true", help="test-sized models (smoke run)")
    ap.add_argument("--width", type=int, default=518)
    ap.add_argument("--height", type=int, default=392)
    ap.add_argument("--frames", type=int, default=5000)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--window-chunks", type=int, default=4)
    ap.add_argument("--overlap", type=int, default=2)
    ap.add_argument("--offline", default="100,200", help="frame counts of VGGT's offline pass")
    ap.add_argument("--window-size", type=int, default=256, help="LingBot-Map windowed: frames per window")
    ap.add_argument("--windowed-height", type=int, default=378, help="LingBot-Map windowed: input height")
    ap.add_argument("--budget-chunked", type=float, default=60.0)
    ap.add_argument("--budget-offline", type=float, default=30.0)
    ap.add_argument("--budget-windowed", type=float, default=40.0)
    ap.add_argument("--skip", default="", help="comma list of phases to skip: chunked,offline,windowed")
    ap.add_argument("--out", default="vggt_bench.json")
    a = ap.parse_args()
    from engine import SessionConfig, open_session
    dev = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    skip = set(filter(None, a.skip.split(",")))
    report = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": a.dtype, "resolution": [a.width, a.height], "args": vars(a)}
    print(f"[env] {report['device']} torch {torch.__version__}", flush=True)
    t_start = time.perf_counter()

    def phase(name):
        print(f"[phase] {name} at {time.perf_counter() - t_start:.1f}s", flush=True)
    imgs = frames(32, a.height, a.width)
    checkpoints = [200, 500, 1000, 2000, 3000, 4000, 5000] if not a.tiny else [10, 20, 40, 60]

    def save_partial(key):
        def write(rows):
            with open(a.out, "w") as f:
                json.dump({**report, key: {"rows": rows, "partial": True}}, f, indent=1)
        return write

    t = time.perf_counter()
    vggt = build("vggt-tiny" if a.tiny else "vggt-1b", dev, dtype)
    print(f"[build] vggt {time.perf_counter() - t:.1f}s", flush=True)
    if "chunked" not in skip:
        phase("chunked")
        cfg = SessionConfig(engine="vggt-1b", device=a.device, dtype=a.dtype, backend=a.backend, image_width=a.width,
                            chunk_size=a.chunk, sliding_window_num=a.window_chunks, overlap=a.overlap)
        s = open_session(cfg, model=vggt)
        report["vggt_chunked"] = stream(s, imgs, a.frames, a.budget_chunked, checkpoints, dev, "vggt-chunked",
                                      on_row=save_partial("vggt_chunked"))
        report["vggt_chunked"]["last_alignment"] = s.stats()["last_alignment"]
        s.close()
        del s
    if "offline" not in skip:
        phase("offline")
        rows = []
        with torch.no_grad():                   # warm-up (kernel selection, workspaces): not timed
            vggt.forward_chunk(torch.stack(imgs[:8]).to(dev), heads=("camera", "depth"))
        sync(dev)
        t_all = time.perf_counter()
        for n in [int(x) for x in a.offline.split(",") if x]:
            if time.perf_counter() - t_all > a.budget_offline:
                break
            batch = torch.stack([imgs[i % len(imgs)] for i in range(n)]).to(dev)
            torch.cuda.empty_cache() if dev.type == "cuda" else None
            peak_reset(dev)
            try:
                sync(dev)
                t = time.perf_counter()
                out = vggt.forward_chunk(batch, heads=("camera", "depth"))
                sync(dev)
                dt = time.perf_counter() - t
                row = {"frames": n, "wall_s": round(dt, 3), "fps": round(n / dt, 2), "peak_gib": round(peak(dev), 3)}
                del out
            except torch.OutOfMemoryError:
                row = {"frames": n, "oom": True}
            del batch
            rows.append(row)
            print(f"[vggt-offline] {json.dumps(row)}", flush=True)
            if row.get("oom"):
                break
        report["vggt_offline"] = rows
        report["vggt_offline_fit"] = offline_fit(rows, dev)
        print(f"[vggt-offline-fit] {json.dumps(report['vggt_offline_fit'])}", flush=True)
    del vggt
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if "windowed" not in skip:
        phase("windowed")
        imgs = frames(32, a.windowed_height, a.width)
        # window 0 takes window_size new frames, every later one window_size - overlap (it re-reads
        # the overlap first): a row at each window's end
        win_cps = list(range(a.window_size, a.frames, a.window_size - 4)) + [a.frames]
        t = time.perf_counter()
        lb = build("lingbot-map-tiny" if a.tiny else "lingbot-map", dev, dtype)
        print(f"[build] lingbot-map {time.perf_counter() - t:.1f}s", flush=True)
        cfg = SessionConfig(engine="lingbot-map", mode="windowed", device=a.device, dtype=a.dtype, backend=a.backend,
                            image_width=a.width, window_size=a.window_size, overlap=4,
                            scale_frames=8 if not a.tiny else 2, window=64 if not a.tiny else 4)
        s = open_session(cfg, model=lb)
        report["lingbot_windowed"] = stream(s, imgs, a.frames, a.budget_windowed, win_cps, dev,
                                            "lingbot-windowed", on_row=save_partial("lingbot_windowed"))
        report["lingbot_windowed"]["alignments"] = len(s.alignments)
        report["lingbot_windowed"]["resolution"] = [a.width, a.windowed_height]
        s.close()
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    phase("done")
    print(f"[done] wrote {a.out}", flush=True)


if __name__ == "__main__":
    main()
