"""Micro-benchmark of one global-layer attention over the paged cache at the steady-state size,
for each backend (SDPA zero-copy view, SDPA gather, FlashInfer paged prefill), plus the
agreement of their outputs. Prints a table and writes JSON.

    python -m benchmarks.kv_microbench --device cuda --dtype bf16 --json out.json

Defaults are the released configuration at 518x378: 999 patches + 6 specials per frame,
16 heads x 64, 8 scale frames, window 64; `--frames` cached frames before the measured step
(71 gives q = 1005 tokens over kv = 72 x 1005 = 72,360 tokens).

`--kv-dtype fp8` instead times an fp8 store against the same keys/values stored in bf16: bf16
SDPA (zero-copy) and FlashInfer FA3 (dense = ragged kernel over the contiguous run, and paged),
fp8 SDPA (dequantise the visible set), and FlashInfer's fp8-KV kernel (FA2 with bf16 q and
e4m3 K/V, paged); every output is compared with an fp32 attention over the bf16 keys/values.

    python -m benchmarks.kv_microbench --device cuda --kv-dtype fp8 --json fp8.json
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

from engine.kv.backends import FlashInferBackend, SDPABackend, flashinfer_available
from engine.kv.paged_cache import PagedKVCache, parse_dtype


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
        for kind in flashinfer_kinds:
            if time_budget_s and time.time() - t_start > time_budget_s:
                res.setdefault("skipped", []).append(f"flashinfer_{kind} (time budget)")
                continue
            try:
                t0 = time.time()
                be = FlashInferBackend(cache, kernel=kind)
                be.plan(step)
                out = be.attend(step, q, 0)
                torch.cuda.synchronize()
                res.setdefault("first_call_s", {})[f"flashinfer_{kind}"] = time.time() - t0
                res["max_abs_diff_vs_fp32"][f"flashinfer_{kind}"] = (out.float() - ref).abs().max().item()
                res["ms"][f"flashinfer_{kind}"] = _time(lambda: be.attend(step, q, 0), iters, warmup, cuda)
                res["ms"][f"flashinfer_{kind}_plan"] = _time(lambda: be.plan(step), 20, 3, cuda)
            except Exception as exc:  # report and go on: one kernel family may not build
                res.setdefault("errors", {})[f"flashinfer_{kind}"] = f"{type(exc).__name__}: {exc}"[:500]
    # bandwidth view: bytes of K and V read once
    kv_bytes = 2 * step.num_kv_tokens * heads * head_dim * cache.k_pool.element_size()
    res["kv_bytes"] = kv_bytes
    res["flops"] = 4 * T * step.num_kv_tokens * heads * head_dim
    cache.end_step()
    return res


def _fill_same(caches, frames: int, gen: torch.Generator, scale_frames: int) -> None:
    """Write the same random frames (fp32, converted by each cache) into every cache (one layer)."""
    c0 = caches[0]
    T = c0.special_tokens + c0.page_size
    for i, nf in enumerate([min(scale_frames, frames)] + [1] * max(frames - scale_frames, 0)):
        k = torch.randn(nf, T, c0.num_heads, c0.head_dim, generator=gen, device=c0.device)
        v = torch.randn_like(k)
        for c in caches:
            c.begin_step(nf, scale=i == 0)
            c.write(0, k, v)
            c.end_step()


def run_fp8(device="cuda", frames=71, patch_tokens=999, heads=16, head_dim=64, scale_frames=8,
            window=64, special_cap=1024, iters=50, warmup=10,
            time_budget_s=None) -> dict:
    """fp8 store vs bf16 store of the same keys/values (see the module docstring)."""
    t_start = time.time()
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    kw = dict(scale_frames=scale_frames, window=window, special_cap=special_cap, device=dev, backend="sdpa")
    cb = PagedKVCache(1, heads, head_dim, patch_tokens, dtype="bf16", **kw)
    c8 = PagedKVCache(1, heads, head_dim, patch_tokens, dtype="fp8", attn_dtype="bf16", **kw)
    gen = torch.Generator(device=dev).manual_seed(0)
    _fill_same([cb, c8], frames, gen, scale_frames)
    T = cb.special_tokens + patch_tokens
    k = torch.randn(1, T, heads, head_dim, generator=gen, device=dev)
    v = torch.randn_like(k)
    q = torch.randn(T, heads, head_dim, generator=gen, device=dev).to(torch.bfloat16)
    steps = {}
    for name, c in (("bf16", cb), ("fp8", c8)):
        steps[name] = c.begin_step(1)
        c.write(0, k, v)
    sb, s8 = steps["bf16"], steps["fp8"]
    kk, vv = SDPABackend(cb, zero_copy=False).visible_kv(sb, 0)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None], kk.float().transpose(0, 1)[None],
        vv.float().transpose(0, 1)[None])[0].transpose(0, 1)
    res = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "q_tokens": T,
           "kv_tokens": sb.num_kv_tokens, "contiguous": sb.contiguous is not None, "heads": heads,
           "head_dim": head_dim, "torch": torch.__version__, "ms": {}, "first_call_s": {},
           "max_abs_diff_vs_fp32": {}, "mean_abs_diff_vs_fp32": {}, "errors": {},
           "pool_bytes": {"bf16": cb.pool.bytes_allocated, "fp8": c8.pool.bytes_allocated},
           "flops": 4 * T * sb.num_kv_tokens * heads * head_dim}

    def measure(name, make, step):
        if time_budget_s and time.time() - t_start > time_budget_s:
            res["errors"][name] = "skipped (time budget)"
            return
        try:
            t0 = time.time()
            be = make()
            be.plan(step)
            out = be.attend(step, q, 0)
            if cuda:
                torch.cuda.synchronize()
            res["first_call_s"][name] = time.time() - t0
            d = (out.float() - ref).abs()
            res["max_abs_diff_vs_fp32"][name] = d.max().item()
            res["mean_abs_diff_vs_fp32"][name] = d.mean().item()
            res["ms"][name] = _time(lambda: be.attend(step, q, 0), iters, warmup, cuda)
        except Exception as exc:  # report and go on: one kernel may not build
            res["errors"][name] = f"{type(exc).__name__}: {exc}"[:500]

    measure("bf16_sdpa", lambda: SDPABackend.create(cb), sb)
    measure("fp8_sdpa_dequant", lambda: SDPABackend.create(c8), s8)
    if cuda and flashinfer_available():
        for dense in (True, False):        # dense = ragged kernel over the contiguous run
            sfx = "" if dense else "_paged"
            measure(f"bf16_flashinfer_fa3{sfx}", lambda: FlashInferBackend(cb, dense=dense, kernel="fa3"), sb)
            if dense:                      # FA2 fp8-KV: always the paged kernel
                measure("fp8_flashinfer_kv", lambda: FlashInferBackend(c8), s8)
    cb.end_step()
    c8.end_step()
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
    ap.add_argument("--kv-dtype", default=None, help="fp8: the fp8-store comparison (run_fp8)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.kv_dtype == "fp8":
        res = run_fp8(a.device, a.frames, a.patch_tokens, scale_frames=a.scale_frames, window=a.window,
                      special_cap=a.special_cap, iters=a.iters,
                      time_budget_s=a.time_budget)
        print(f"{res['device']} fp8 store vs bf16: q={res['q_tokens']} kv={res['kv_tokens']} "
              f"pools {res['pool_bytes']}")
        for name, ms in res["ms"].items():
            tf = res["flops"] / (ms * 1e-3) / 1e12
            print(f"  {name:26s} {ms:8.3f} ms {tf:7.1f} TFLOP/s  max|d| {res['max_abs_diff_vs_fp32'][name]:.2e}"
                  f"  mean|d| {res['mean_abs_diff_vs_fp32'][name]:.2e}  first call {res['first_call_s'][name]:.1f} s")
        for k, v in res["errors"].items():
            print(f"  {k}: ERROR {v}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
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
