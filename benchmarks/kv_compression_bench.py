"""KV compression / quantization figures (docs/benchmarks_kv.md "Compression knobs").

    PYTHONPATH=. python3 benchmarks/kv_compression_bench.py --device cuda --out out/kvc   # H200
    PYTHONPATH=. python3 benchmarks/kv_compression_bench.py --device cpu --model lingbot-map-tiny \
        --patches 4x5 --frames 12 --out /tmp/kvc                                         # smoke test

1. global attention of one layer (16 heads x 64, 999 patch tokens = 518x378, 8 scale frames) per
   kv_compression method at window 64 and 256, both backends: ms per attend call in steady state
   (the window full), visible tokens;
2. KV pool bytes of the full geometry (24 layers) for bf16 / fp8 / int8 and the storing methods;
3. full model (random weights, bf16) streamed: FPS and peak allocated for bf16, kv fp8, kv fp8 +
   fp8 weights;
4. output deviation of every method and KV dtype from the uncompressed bf16 run, with the fixture
   recipe weights on the real ICL frames (.cache/frames/icl_kt3.mp4): a numerical-deviation
   measure (the recipe weights are not trained weights).
Everything is written to OUT/kv_compression.json as it is measured (a time-out keeps what was done).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

METHODS = ("none", "token_partition", "random_subset", "token_merge", "block_sparse")


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def attention_bench(dev, dtype, window, method, backend, patches, heads=16, head_dim=64, iters=20,
                    keep=0.5, kv_dtype=None):
    from engine.kv import PagedKVCache, make_compressor
    cache = PagedKVCache(1, heads, head_dim, patches, scale_frames=8, window=window,
                         special_cap=max(1024, 8 + window), dtype=kv_dtype or dtype, attn_dtype=dtype,
                         device=dev, backend=backend,
                         compression=make_compressor(method, keep_ratio=keep, block_size=256, seed=0))
    T = 6 + patches
    g = torch.Generator(device=dev).manual_seed(0)

    def step(n, scale=False):
        cache.begin_step(n, scale=scale)
        k = torch.randn(n, T, heads, head_dim, generator=g, device=dev, dtype=dtype)
        cache.write(0, k, torch.randn_like(k))
        cache.attend(0, k)
        cache.end_step()

    step(8, scale=True)
    for _ in range(window):
        step(1)
    st = cache.begin_step(1)
    k = torch.randn(1, T, heads, head_dim, generator=g, device=dev, dtype=dtype)
    cache.write(0, k, torch.randn_like(k))
    for _ in range(3):
        cache.attend(0, k)
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        cache.attend(0, k)
    _sync(dev)
    ms = (time.perf_counter() - t0) / iters * 1e3
    visible = st.num_kv_tokens
    cache.end_step()
    s = cache.stats()
    return {"ms": ms, "visible_tokens": visible, "kept_tokens": s["kept_tokens"], "backend": s["backend"]}


def read_frames(path, n):
    import cv2
    cap = cv2.VideoCapture(str(path))
    out = []
    while len(out) < n:
        ok, img = cap.read()
        if not ok:
            break
        out.append(cv2.cvtColor(img, cv2.COLOR_BGR2RGB))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="lingbot-map")
    ap.add_argument("--patches", default="37x27", help="patch grid WxH of the attention bench")
    ap.add_argument("--windows", default="64,256")
    ap.add_argument("--frames", type=int, default=40, help="frames of the full-model runs")
    ap.add_argument("--video", default=".cache/frames/icl_kt3.mp4")
    ap.add_argument("--out", default="out/kvc")
    ap.add_argument("--budget-s", type=float, default=200.0)
    a = ap.parse_args()
    t_start = time.time()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
           "dtype": str(dtype), "attention": [], "pools": {}, "model": {}, "deviation": {}}

    def save():
        (out_dir / "kv_compression.json").write_text(json.dumps(res, indent=1, default=str))

    def left():
        return a.budget_s - (time.time() - t_start)

    from engine.kv import flashinfer_available
    pw, ph = (int(x) for x in a.patches.split("x"))
    patches = pw * ph
    backends = ["sdpa"] + (["flashinfer"] if cuda and flashinfer_available() else [])
    # 1. attention per method / window / backend
    for W in (int(x) for x in a.windows.split(",")):
        for backend in backends:
            for method in METHODS:
                for keep in ((1.0,) if method == "none" else (0.5, 0.25)):
                    if left() < 120:
                        break
                    try:
                        r = attention_bench(dev, dtype, W, method, backend, patches, keep=keep, iters=10)
                    except Exception as exc:
                        r = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    r.update(window=W, method=method, keep_ratio=keep, requested_backend=backend)
                    res["attention"].append(r)
                    print(json.dumps(r), flush=True)
                    save()
    # fp8 KV attention (FlashInfer fp8 kernel may need a JIT build: last, guarded)
    for backend in backends[::-1]:
        if left() < 110:
            break
        try:
            r = attention_bench(dev, dtype, 64, "none", backend, patches, kv_dtype="fp8")
        except Exception as exc:
            r = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        r.update(window=64, method="none", kv_dtype="fp8", requested_backend=backend)
        res["attention"].append(r)
        print(json.dumps(r), flush=True)
        save()

    # 2. pool bytes at the full geometry (24 layers, window 64)
    from engine.kv import PagedKVCache, make_compressor
    L = 24 if a.model == "lingbot-map" else 4
    for name, kw in (("bf16", dict(dtype="bf16")), ("fp8", dict(dtype="fp8", attn_dtype="bf16")),
                     ("int8", dict(dtype="int8", attn_dtype="bf16")),
                     ("bf16+token_partition0.5", dict(dtype="bf16", compression=make_compressor("token_partition", 0.5))),
                     ("fp8+token_partition0.5", dict(dtype="fp8", attn_dtype="bf16",
                                                     compression=make_compressor("token_partition", 0.5)))):
        c = PagedKVCache(L, 16, 64, patches, scale_frames=8, window=64, special_cap=1024, device=dev,
                         backend="sdpa", **kw)
        res["pools"][name] = c.pool.bytes_allocated / 2**30
        del c
        if cuda:
            torch.cuda.empty_cache()
    print("pools GiB", res["pools"], flush=True)
    save()

    from engine import SessionConfig, open_session
    from engine.bench import BenchConfig, build_bench_model
    frames = read_frames(a.video, a.frames)
    width = 14 * pw

    def stream(model, **kw):
        cfg = SessionConfig(engine="lingbot-map", device=str(dev), dtype="bf16" if cuda else "fp32",
                            image_width=width, scale_frames=8, window=64, special_cap=1024,
                            cuda_graphs=False, **kw)
        s = open_session(cfg, model=model)
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        outs = []
        t0 = None
        for i, f in enumerate(frames):
            if i == 12:
                _sync(dev)
                t0 = time.perf_counter()
            outs += s.push(f)
        outs += s.flush()
        _sync(dev)
        fps = (len(frames) - 12) / (time.perf_counter() - t0) if t0 else None
        st = s.stats()
        peak = torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None
        s.close()
        return outs, {"fps": fps, "peak_allocated_gib": peak, "kv_pool_gib": st["kv"]["bytes_allocated"] / 2**30,
                      "kv_kept_gib": st["kv"]["bytes_kept"] / 2**30}

    # 4. deviation with the recipe weights on the real frames
    if left() > 60:
        model = build_bench_model(BenchConfig(model=a.model, weights="recipe", device=str(dev)))
        ref, info = stream(model)
        res["deviation"]["none"] = info
        pe_ref = np.stack([r.pose_enc for r in ref])
        d_ref = np.stack([r.depth for r in ref])
        for method, kv_dtype in [(m, "auto") for m in METHODS[1:]] + [("none", "fp8"), ("none", "int8")]:
            if left() < 45:
                break
            try:
                outs, info = stream(model, kv_compression=method, kv_dtype=kv_dtype,
                                    backend="sdpa" if kv_dtype == "int8" else "auto")
                pe = np.stack([r.pose_enc for r in outs])
                d = np.stack([r.depth for r in outs])
                info.update(
                    pose_enc_rel_l2=float(np.linalg.norm(pe - pe_ref) / np.linalg.norm(pe_ref)),
                    pose_enc_max_abs=float(np.abs(pe - pe_ref).max()),
                    depth_median_rel=float(np.median(np.abs(d - d_ref) / np.maximum(np.abs(d_ref), 1e-6))))
            except Exception as exc:
                info = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            res["deviation"][f"{method}/{kv_dtype}"] = info
            print(method, kv_dtype, json.dumps(info), flush=True)
            save()
        del model
        if cuda:
            torch.cuda.empty_cache()
    # 3. memory of the full model: bf16 vs kv fp8 vs kv fp8 + fp8 weights (random weights)
    if left() > 30:
        model = build_bench_model(BenchConfig(model=a.model, weights="random", device=str(dev)))
        for name, kw in (("bf16", {}), ("kv_fp8", dict(kv_dtype="fp8")),
                         ("kv_fp8+weights_fp8", dict(kv_dtype="fp8", weight_dtype="fp8"))):
            if left() < 15:
                break
            try:
                _, info = stream(model, **kw)
            except Exception as exc:
                info = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            res["model"][name] = info
            print(name, json.dumps(info), flush=True)
            save()
    res["elapsed_s"] = time.time() - t_start
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
