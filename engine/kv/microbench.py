"""Micro-benchmark of one global-layer attention over the paged cache at the steady-state size,
for each backend (SDPA zero-copy view, SDPA gather, FlashInfer paged prefill), plus the
agreement of their outputs. Prints a table and writes JSON.

    python -m engine.kv.microbench --device cuda --dtype bf16 --json out.json

Defaults are the released configuration at 518x378: 999 patches + 6 specials per frame,
16 heads x 64, 8 scale frames, window 64; `--frames` cached frames before the measured step
(71 gives q = 1005 tokens over kv = 72 x 1005 = 72,360 tokens).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

from .backends import FlashInferBackend, SDPABackend, flashinfer_available
from .paged_cache import PagedKVCache, parse_dtype


def _fill(cache: PagedKVCache, frames: int, gen: torch.Generator) -> None:
    T = cache.special_tokens + cache.page_size
    shape = (1, T, cache.num_heads, cache.head_dim)
    first = min(cache.scale_frames, frames)
    cache.begin_step(first, scale=True)
    k = torch.randn((first,) + shape[1:], generator=gen, device=cache.device).to(cache.dtype)
    cache.write(0, k, torch.randn_like(k))
    cache.end_step()
    for _ in range(frames - first):
        cache.begin_step(1)
        k = torch.randn(shape, generator=gen, device=cache.device).to(cache.dtype)
        cache.write(0, k, torch.randn_like(k))
        cache.end_step()


def _time(fn, iters: int, warmup: int, cuda: bool) -> float:
    """Median milliseconds per call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def run(device="cuda", dtype="bf16", frames=71, patch_tokens=999, heads=16, head_dim=64,
        scale_frames=8, window=64, special_cap=1024, iters=50, warmup=10,
        flashinfer_kinds=("fa3", "fa2"), time_budget_s=None) -> dict:
    t_start = time.time()
    dev = torch.device(device)
    dt = parse_dtype(dtype)
    cuda = dev.type == "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    cache = PagedKVCache(1, heads, head_dim, patch_tokens, scale_frames=scale_frames, window=window,
                         special_cap=special_cap, dtype=dt, device=dev, backend="sdpa")
    _fill(cache, frames, gen)
    T = cache.special_tokens + patch_tokens
    step = cache.begin_step(1)
    k = torch.randn(1, T, heads, head_dim, generator=gen, device=dev).to(dt)
    cache.write(0, k, torch.randn_like(k))
    q = torch.randn(T, heads, head_dim, generator=gen, device=dev).to(dt)
    kp, vp = cache.k_pool[0], cache.v_pool[0]
    res = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "dtype": str(dt),
           "q_tokens": T, "kv_tokens": step.num_kv_tokens, "pages": len(step.pages),
           "contiguous": step.contiguous is not None, "page_size": patch_tokens,
           "heads": heads, "head_dim": head_dim, "cached_frames_before": frames,
           "torch": torch.__version__, "ms": {}, "max_abs_diff_vs_fp32": {}}

    # fp32 reference over the gathered visible set
    kk, vv = SDPABackend(cache, zero_copy=False).visible_kv(step, 0)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None], kk.float().transpose(0, 1)[None],
        vv.float().transpose(0, 1)[None])[0].transpose(0, 1)

    variants = {"sdpa_zero_copy": SDPABackend(cache, zero_copy=True),
                "sdpa_gather": SDPABackend(cache, zero_copy=False)}
    if cuda:
        from torch.nn.attention import SDPBackend
        order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]
        variants["sdpa_zero_copy_cudnn_first"] = SDPABackend(cache, zero_copy=True, kernels=order)
        variants["sdpa_zero_copy_flash_only"] = SDPABackend(cache, zero_copy=True,
                                                           kernels=[SDPBackend.FLASH_ATTENTION])
    for name, be in variants.items():
        out = be.attend(step, q, 0)
        res["max_abs_diff_vs_fp32"][name] = (out.float() - ref).abs().max().item()
        res["ms"][name] = _time(lambda: be.attend(step, q, 0), iters, warmup, cuda)

    if cuda and flashinfer_available() and dt in (torch.bfloat16, torch.float16):
        import os
        for kind in flashinfer_kinds:
            if time_budget_s and time.time() - t_start > time_budget_s:
                res.setdefault("skipped", []).append(f"flashinfer_{kind} (time budget)")
                continue
            os.environ["RECONSTUDIO_FLASHINFER_BACKEND"] = kind
            try:
                t0 = time.time()
                be = FlashInferBackend(cache)
                be.plan(step)
                out = be.attend(step, q, 0)
                torch.cuda.synchronize()
                res.setdefault("first_call_s", {})[f"flashinfer_{kind}"] = time.time() - t0
                res["max_abs_diff_vs_fp32"][f"flashinfer_{kind}"] = (out.float() - ref).abs().max().item()
                res["ms"][f"flashinfer_{kind}"] = _time(lambda: be.attend(step, q, 0), iters, warmup, cuda)
                res["ms"][f"flashinfer_{kind}_plan"] = _time(lambda: be.plan(step), 20, 3, cuda)
            except Exception as exc:  # report and go on: one kernel family may not build
                res.setdefault("errors", {})[f"flashinfer_{kind}"] = f"{type(exc).__name__}: {exc}"[:500]
            finally:
                os.environ.pop("RECONSTUDIO_FLASHINFER_BACKEND", None)
    # bandwidth view: bytes of K and V read once
    kv_bytes = 2 * step.num_kv_tokens * heads * head_dim * cache.k_pool.element_size()
    res["kv_bytes"] = kv_bytes
    res["flops"] = 4 * T * step.num_kv_tokens * heads * head_dim
    cache.end_step()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--frames", type=int, default=71, help="cached frames before the measured step")
    ap.add_argument("--patch-tokens", type=int, default=999)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--scale-frames", type=int, default=8)
    ap.add_argument("--special-cap", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--flashinfer", default="fa3,fa2", help="FlashInfer kernel families to time")
    ap.add_argument("--time-budget", type=float, default=None, help="skip FlashInfer kinds after this many s")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res = run(a.device, a.dtype, a.frames, a.patch_tokens, scale_frames=a.scale_frames, window=a.window,
              special_cap=a.special_cap, iters=a.iters,
              flashinfer_kinds=tuple(x for x in a.flashinfer.split(",") if x), time_budget_s=a.time_budget)
    print(f"{res['device']} {res['dtype']} q={res['q_tokens']} kv={res['kv_tokens']} "
          f"pages={res['pages']} contiguous={res['contiguous']}")
    for name, ms in res["ms"].items():
        extra = ""
        if name in res["max_abs_diff_vs_fp32"]:
            tf = res["flops"] / (ms * 1e-3) / 1e12
            extra = f"  {tf:7.1f} TFLOP/s  max|d| vs fp32 {res['max_abs_diff_vs_fp32'][name]:.2e}"
        print(f"  {name:32s} {ms:8.3f} ms{extra}")
    for k, v in res.get("errors", {}).items():
        print(f"  {k}: ERROR {v}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
