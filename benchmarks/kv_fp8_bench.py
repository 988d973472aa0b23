"""fp8 KV on the GPU: build FlashInfer's fp8 kernels, and the full model's peak memory with fp8
weights + fp8 KV (docs/benchmarks_kv.md "fp8 KV through FlashInfer"). Run by benchmarks/kv_fp8_gpu.sh.

    python3 benchmarks/kv_fp8_bench.py build               # JIT-build FA2 bf16-q / e4m3-KV (prints s)
    python3 benchmarks/kv_fp8_bench.py memory --out m.json [--wait-for FILE --deadline-s 120]

`memory` builds LingBot-Map (random weights, bf16) once and streams random 518x378 frames
(999 patches; the 2026-12-01 runs streamed 640x480 frames, i.e. 518x392 = 1,036 patches), window 64, 8 scale frames, special cap 1024, every frame a keyframe, CUDA graphs off,
for each of `--runs` (RUNS below; fp8 weights via torchao, in place, so they go last). With
--wait-for FILE, the first FlashInfer fp8-KV run waits until FILE holds 0 (the FA2 build is done).
Peak = torch.cuda.max_memory_allocated after a reset at session start (the weights are included:
they stay allocated). JSON is written after every run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build() -> int:
    """Trigger (and time) the JIT build of FlashInfer's fp8-KV prefill module with a tiny step."""
    from engine.kv import PagedKVCache
    t0 = time.time()
    c = PagedKVCache(1, 16, 64, 999, scale_frames=1, window=2, special_cap=8, dtype="fp8",
                     attn_dtype="bf16", device="cuda", backend="flashinfer")
    c.begin_step(1, scale=True)
    k = torch.randn(1, 1005, 16, 64, device="cuda")
    c.write(0, k, k)
    out = c.attend(0, k.to(torch.bfloat16))
    torch.cuda.synchronize()
    print(f"build: kernel {c.attention.kernel}, {time.time() - t0:.1f} s, finite {bool(torch.isfinite(out).all())}",
          flush=True)
    return 0


# full-model runs (weights are quantized in place, so bf16-weight runs go first)
RUNS = {
    "kv_bf16_flashinfer": dict(backend="flashinfer"),
    "kv_fp8_flashinfer": dict(kv_dtype="fp8", backend="flashinfer"),
    "kv_fp8_sdpa+weights_fp8": dict(kv_dtype="fp8", backend="sdpa", weight_dtype="fp8"),
    "kv_fp8_flashinfer+weights_fp8": dict(kv_dtype="fp8", backend="flashinfer", weight_dtype="fp8"),
}


def memory(out: str, frames: int, wait_for: str | None, deadline_s: float, device="cuda",
           model_name="lingbot-map", width=518, window=64,
           runs=("kv_fp8_sdpa+weights_fp8", "kv_fp8_flashinfer+weights_fp8")) -> int:
    from engine import SessionConfig, open_session
    from engine.bench import BenchConfig, build_bench_model
    t_start = time.time()
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    height = max(14, round(width * 378 / 518 / 14) * 14)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "model": model_name,
           "torch": torch.__version__, "frames": frames, "runs": {},
           "settings": f"width {width}, height {height}, window {window}, 8 scale frames, special cap 1024, "
                       "keyframe every frame, bf16 compute, random weights, CUDA graphs off"}

    def save():
        Path(out).write_text(json.dumps(res, indent=1, default=str))

    model = build_bench_model(BenchConfig(model=model_name, weights="random", device=device))
    res["model_build_s"] = time.time() - t_start
    rng = np.random.default_rng(0)
    # frames already at width x (width * 378 / 518): no resize changes the token count (a 640x480
    # frame would become 518x392 = 1,036 patches instead of 999; engine/preprocess.py)
    imgs = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(8)]

    def stream(name, **kw):
        cfg = SessionConfig(engine="lingbot-map", device=device, dtype="bf16" if cuda else "fp32",
                            image_width=width, scale_frames=8, window=window, special_cap=1024, cuda_graphs=False, **kw)
        sync()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        t_open = time.time()
        s = open_session(cfg, model=model)
        open_s = time.time() - t_open
        n_out, t0 = 0, None
        for i in range(frames):
            if i == frames - 20:
                sync()
                t0 = time.perf_counter()
            n_out += len(s.push(imgs[i % len(imgs)]))
        n_out += len(s.flush())
        sync()
        fps = 20 / (time.perf_counter() - t0)
        st = s.stats()
        kv = st.get("kv", {})
        r = {"peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None,
             "allocated_after_gib": torch.cuda.memory_allocated(dev) / 2**30 if cuda else None,
             "kv_pool_gib": kv.get("bytes_allocated", 0) / 2**30, "kv_backend": kv.get("backend"),
             "kv_dtype": kv.get("dtype"), "cached_frames": kv.get("cached_frames"),
             "visible_tokens": kv.get("visible_tokens"), "fp8_saturated": kv.get("fp8_saturated"),
             "fps_last_20": fps, "results": n_out, "open_s": open_s, **{f"cfg_{k}": v for k, v in kw.items()}}
        s.close()
        res["runs"][name] = r
        print(name, json.dumps(r), flush=True)
        save()

    waited = False
    for name in runs:
        kw = RUNS[name]
        if wait_for and kw.get("backend") == "flashinfer" and kw.get("kv_dtype") == "fp8" and not waited:
            while not Path(wait_for).exists() and time.time() - t_start < deadline_s:   # holds the exit status
                time.sleep(1)
            time.sleep(0.2)
            res["waited_for_build_s"], waited = time.time() - t_start, True
            if not (Path(wait_for).exists() and Path(wait_for).read_text().strip() == "0"):
                res["runs"][name] = {"error": "FA2 fp8 build failed or not finished in time"}
                save()
                break
        try:
            stream(name, **kw)
        except Exception as exc:
            res["runs"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(name, res["runs"][name], flush=True)
            save()
    res["elapsed_s"] = time.time() - t_start
    save()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    m = sub.add_parser("memory")
    m.add_argument("--out", default="kv_fp8_memory.json")
    m.add_argument("--frames", type=int, default=84)
    m.add_argument("--wait-for", default=None, help="file holding the FA2 fp8 build's exit status once done")
    m.add_argument("--deadline-s", type=float, default=120.0)
    m.add_argument("--device", default="cuda")
    m.add_argument("--model", default="lingbot-map", help="lingbot-map-tiny for a CPU smoke run")
    m.add_argument("--width", type=int, default=518)
    m.add_argument("--window", type=int, default=64)
    m.add_argument("--runs", default="kv_fp8_sdpa+weights_fp8,kv_fp8_flashinfer+weights_fp8",
                   help=f"comma-separated, in order, of: {', '.join(RUNS)}")
    a = ap.parse_args()
    if a.cmd == "build":
        return build()
    runs = [r for r in a.runs.split(",") if r]
    bad = [r for r in runs if r not in RUNS]
    if bad:
        ap.error(f"unknown runs {bad}; choose from {list(RUNS)}")
    return memory(a.out, a.frames, a.wait_for, a.deadline_s, a.device, a.model, a.width, a.window, runs)


if __name__ == "__main__":
    raise SystemExit(main())
