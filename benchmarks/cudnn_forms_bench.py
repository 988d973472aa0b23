"""Which form of cuDNN's fused attention, called through the cuDNN frontend, keeps cuDNN's fast
path at LingBot-Map's steady global-attention shape (GPU; the figures go to docs/benchmarks.md):

    python3 benchmarks/cudnn_forms_bench.py [--reps 30] [--json OUT]

q = 1,005 tokens, 16 heads x 64, bf16; 73,728 visible keys inside a buffer of 78,921 (the pool
from page 1, as `CuDNNSeqLenBackend` views it). Forms (each its own frontend graph):
- plain: no mask, the K/V length exactly the visible length (what PyTorch's cuDNN call builds,
  one graph per length);
- padding: cuDNN's padding mask with the visible length as a device tensor, K/V dims = exactly
  the visible length / the whole buffer / the buffer rounded down to a multiple of 128;
- dynamic: `is_dynamic_shape_enabled` graphs sharing one kernel cache, one graph per length, no
  mask: host time to build the graph for each new length (+6 tokens, as the special stream
  grows) and the kernel time;
- override: one dynamic graph at the buffer's length executed with the K/V shapes overridden to
  the visible length (cuDNN >= 9.18 variant-pack overrides), if this frontend/cuDNN accept it.
Median CUDA-event time of `--reps` calls, relative difference to PyTorch's SDPA (flash).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch

H, D, NQ, L, CAP = 16, 64, 1005, 73728, 78921
UID = dict(q=1, k=2, v=3, o=4, sq=5, skv=6)


def main(argv=None) -> None:
    import cudnn
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    g0 = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(NQ, H, D, generator=g0, device=dev, dtype=torch.bfloat16)
    kbuf = torch.randn(CAP, H, D, generator=g0, device=dev, dtype=torch.bfloat16)
    vbuf = torch.randn(CAP, H, D, generator=g0, device=dev, dtype=torch.bfloat16)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], kbuf[:L].transpose(0, 1)[None], vbuf[:L].transpose(0, 1)[None])[0].transpose(0, 1).float()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    seq_q = torch.full((1, 1, 1, 1), NQ, dtype=torch.int32, device=dev)
    seq_kv = torch.full((1, 1, 1, 1), L, dtype=torch.int32, device=dev)
    kcache = cudnn.create_kernel_cache()
    bf, i32 = cudnn.data_type.BFLOAT16, cudnn.data_type.INT32
    print(f"cuDNN frontend {cudnn.__version__}, backend {cudnn.backend_version()}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}; q {NQ}, visible {L}, buffer {CAP}, H {H}, D {D}")

    def build(S, padding, dynamic=False):
        kw = dict(kernel_cache=kcache, is_dynamic_shape_enabled=True) if dynamic else {}
        g = cudnn.pygraph(handle=handle, io_data_type=bf, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, **kw)
        qt = g.tensor(name="q", dim=[1, H, NQ, D], stride=[NQ * H * D, D, H * D, 1], data_type=bf)
        kt = g.tensor(name="k", dim=[1, H, S, D], stride=[S * H * D, D, H * D, 1], data_type=bf)
        vt = g.tensor(name="v", dim=[1, H, S, D], stride=[S * H * D, D, H * D, 1], data_type=bf)
        named = dict(q=qt, k=kt, v=vt)
        extra = {}
        if padding:
            named["sq"] = g.tensor(name="sq", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)
            named["skv"] = g.tensor(name="skv", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)
            extra = dict(use_padding_mask=True, seq_len_q=named["sq"], seq_len_kv=named["skv"])
        o, _ = g.sdpa(name="sdpa", q=qt, k=kt, v=vt, attn_scale=1.0 / math.sqrt(D), generate_stats=False,
                      compute_data_type=cudnn.data_type.FLOAT, **extra)
        o.set_output(True).set_dim([1, H, NQ, D]).set_stride([NQ * H * D, D, H * D, 1]).set_data_type(bf)
        named["o"] = o
        for n, t in named.items():
            t.set_uid(UID[n])
        t0 = time.perf_counter()
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        build_ms = 1e3 * (time.perf_counter() - t0)
        ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=dev)
        return g, ws, build_ms

    def ptrs(out, padding):
        p = {UID["q"]: q.data_ptr(), UID["k"]: kbuf.data_ptr(), UID["v"]: vbuf.data_ptr(), UID["o"]: out.data_ptr()}
        if padding:
            p.update({UID["sq"]: seq_q.data_ptr(), UID["skv"]: seq_kv.data_ptr()})
        return p

    def timed(fn):
        for _ in range(3):
            fn()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)]
        for s, e in evs:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return sorted(s.elapsed_time(e) for s, e in evs)[a.reps // 2]

    rows = []

    def report(name, out, ms, **extra):
        diff = float((out.float() - ref).norm() / ref.norm())
        rows.append({"form": name, "ms": ms, "rel_diff_to_sdpa_flash": diff, **extra})
        print(f"{name:58s} {ms:7.3f} ms  rel diff {diff:.1e}  {extra if extra else ''}")

    for name, S, padding in [("plain, K/V = visible (PyTorch's graph)", L, False),
                             ("padding mask, K/V = visible", L, True),
                             ("padding mask, K/V = buffer (the backend today)", CAP, True),
                             ("padding mask, K/V = buffer rounded down to 128", CAP // 128 * 128, True)]:
        try:
            g, ws, bms = build(S, padding)
            out = torch.empty_like(q)
            p = ptrs(out, padding)
            ms = timed(lambda: g.execute(p, ws, handle=handle))
            report(name, out, ms, build_ms=round(bms, 2), kv_dim=S)
        except Exception as exc:
            print(f"{name:58s} failed: {type(exc).__name__}: {str(exc)[:300]}")
            rows.append({"form": name, "error": f"{type(exc).__name__}: {exc}"[:500]})

    # dynamic shapes + kernel cache: one graph per length, the kernel compiled once
    try:
        builds = []
        for i in range(6):
            S = L - 6 * (5 - i)
            g, ws, bms = build(S, False, dynamic=True)
            builds.append(round(bms, 2))
        out = torch.empty_like(q)
        p = ptrs(out, False)
        ms = timed(lambda: g.execute(p, ws, handle=handle))
        report("dynamic shapes + kernel cache, no mask, K/V = visible", out, ms, build_ms_per_new_length=builds)
    except Exception as exc:
        print(f"dynamic shapes failed: {type(exc).__name__}: {str(exc)[:300]}")
        rows.append({"form": "dynamic", "error": f"{type(exc).__name__}: {exc}"[:500]})

    # one dynamic graph at the buffer length, K/V shapes overridden per call
    try:
        g, ws, bms = build(CAP, False, dynamic=True)
        out = torch.empty_like(q)
        p = ptrs(out, False)
        shape = [1, H, L, D]
        stride = [L * H * D, D, H * D, 1]
        run = lambda: g._execute(p, ws.data_ptr(), handle, [UID["k"], UID["v"]], [shape, shape],  # noqa: E731
                                 [stride, stride])
        ms = timed(run)
        report("override shapes, one graph at the buffer length", out, ms, build_ms=round(bms, 2))
    except Exception as exc:
        print(f"override shapes failed: {type(exc).__name__}: {str(exc)[:300]}")
        rows.append({"form": "override", "error": f"{type(exc).__name__}: {exc}"[:500]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "cudnn": cudnn.backend_version(),
                       "frontend": cudnn.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
