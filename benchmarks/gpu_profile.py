"""Where does a steady-state LingBot-Map frame spend its time on the GPU? (device-side diagnosis)

Streams synthetic frames through a bf16 session to the steady state, then (1) times the SDPA
kernel choices on the same session, (2) prints a torch.profiler table of a few frames, (3) times
SDPA alone on the pool views the session attends to. Run on the GPU machine:
    python3 benchmarks/gpu_profile.py [--backend sdpa|flashinfer|cudnn|cudnn-split] [--frames 80] [--variants]
        [--compile-blocks] [--special-cap N] [--graph-scope fixed|all|step]
(`bash benchmarks/gpu_bench.sh` runs it after sourcing benchmarks/gpu_env.sh)
"""
import argparse
import time

import torch
from torch.nn.attention import SDPBackend

from engine import SessionConfig, open_session
from engine.bench import BenchConfig, build_bench_model


def ms_per_frame(session, frames, n):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(n):
        session.push(frames[i % len(frames)])
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t) / n


def replay_step_graphs(model, label: str, n: int = 20) -> None:
    """GPU time of the captured whole-step graphs replayed back to back (no host work between
    them): the push loop's ms/frame minus this is what the host adds per frame. Replays repeat
    the last step's cache writes with the same values, so the session is unchanged."""
    graphs = model.aggregator.graphs
    for key, g in list(getattr(graphs, "_graphs", {}).items()):
        if not (isinstance(key[0], tuple) and key[0][0] == "step"):
            continue
        g.graph.replay()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            g.graph.replay()
        torch.cuda.synchronize()
        print(f"[{label}] step graph {key[0][1]!s:.60} replayed alone: {1e3 * (time.perf_counter() - t) / n:.2f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--frames", type=int, default=80)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--compile-blocks", action="store_true", help="the opt-in compiled blocks")
    ap.add_argument("--special-cap", type=int, default=1024,
                    help="a small cap reaches the full special ring (fixed-length steps) sooner")
    ap.add_argument("--graph-scope", default=None, choices=("fixed", "all", "step"),
                    help="the model's CUDA-graph scope (default: the model's); 'step' hides the sections")
    ap.add_argument("--profile-scope", default=None, choices=("fixed", "all", "step"),
                    help="switch to this graph scope before the profiled frames (kernels of whole-step "
                         "graph replays may not show in the table)")
    ap.add_argument("--rows", type=int, default=22, help="rows of the kernel table")
    a = ap.parse_args()
    cfg = BenchConfig(backend=a.backend)
    model = build_bench_model(cfg)
    if a.graph_scope:
        model.aggregator.graph_scope = a.graph_scope
    s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", backend=a.backend,
                                   image_width=518, scale_frames=8, window=64, special_cap=a.special_cap,
                                   compile_blocks=a.compile_blocks), model=model)
    frames = [torch.rand(3, 378, 518) for _ in range(8)]
    for i in range(a.frames):
        s.push(frames[i % 8])
    print(f"[{a.backend}] steady ms/frame: {ms_per_frame(s, frames, 20):.1f}")
    replay_step_graphs(model, a.backend)
    print(f"[{a.backend}] attention {s.kv.attention.describe()}, choice {s.kv.stats()['backend_choice']}")
    if a.variants and a.backend == "sdpa":
        attn = s.kv.attention
        for name, ks in [("flash", [SDPBackend.FLASH_ATTENTION]), ("cudnn", [SDPBackend.CUDNN_ATTENTION]),
                         ("efficient", [SDPBackend.EFFICIENT_ATTENTION])]:
            attn.kernels = ks
            try:
                print(f"[sdpa:{name}] steady ms/frame: {ms_per_frame(s, frames, 20):.1f}")
            except Exception as exc:
                print(f"[sdpa:{name}] failed: {str(exc)[:200]}")
        attn.kernels = None
    if a.profile_scope:
        model.aggregator.graph_scope = a.profile_scope
        for i in range(4):            # the parts' graphs of the new scope are captured here
            s.push(frames[i % 8])
        print(f"[{a.backend}] steady ms/frame, scope {a.profile_scope}: {ms_per_frame(s, frames, 20):.1f}")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            s.push(frames[i % 8])
        torch.cuda.synchronize()
    ka = prof.key_averages()
    print(ka.table(sort_by="self_cuda_time_total", row_limit=a.rows, max_name_column_width=60))
    # GPU time per named section (engine/models/sections.py), kernels of graph replays included
    sections = ("patch_embed", "frame_blocks", "global_blocks", "global_attention", "camera_head", "depth_head")
    incl = {e.key: getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / 3e3
            for e in ka if e.key in sections}
    print(f"[{a.backend}] GPU time per frame by section (inclusive): " +
          ", ".join(f"{k} {incl[k]:.2f} ms" for k in sections if k in incl))
    cpu_total = sum(e.self_cpu_time_total for e in ka) / 3e3
    dev = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))  # noqa: E731
    cuda_total = sum(dev(e) for e in ka) / 3e3
    print(f"[{a.backend}] per frame: self CPU {cpu_total:.1f} ms, self CUDA {cuda_total:.1f} ms")
    # kernel time per frame by kind (names of the device-side events)
    kinds = {"attention (FlashInfer / flash / cuDNN)": ("flashinfer", "flash_fwd", "fmha", "cudnn", "attention"),
             "matmul (cuBLAS / nvjet / gemm)": ("nvjet", "gemm", "gemv", "cutlass", "sm90_xmma"),
             "layer norm": ("layer_norm",), "memcpy / memset": ("memcpy", "memset")}
    by = {k: 0.0 for k in kinds}
    by["other (elementwise, RoPE, ...)"] = 0.0
    for e in ka:
        t = dev(e)
        if t <= 0 or getattr(e, "device_type", None) is not None and "CUDA" not in str(e.device_type):
            continue
        name = e.key.lower()
        if name.startswith("aten::") or name.startswith("cuda") and "memcpy" not in name:
            continue                      # host-side ops; their kernels are counted by name
        k = next((k for k, pats in kinds.items() if any(p in name for p in pats)), "other (elementwise, RoPE, ...)")
        by[k] += t / 3e3
    tot = sum(by.values())
    print(f"[{a.backend}] kernel time per frame by kind (of {tot:.1f} ms): " +
          ", ".join(f"{k} {v:.1f} ms ({100 * v / max(tot, 1e-9):.0f} %)" for k, v in by.items()))
    # host synchronisations inside steady steps (PyTorch's sync debug mode warns on each)
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for i in range(5):
                s.push(frames[i % 8])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(x.message).splitlines()[0][:120] for x in w
             if "synchroniz" in str(x.message).lower() and "prototype" not in str(x.message)]
    print(f"[{a.backend}] host synchronisations reported in 5 steady frames: {len(syncs)} "
          f"{sorted(set(syncs))[:5]}")
    # SDPA alone on the session's own pool views (steady-state visible set)
    kv = s.kv
    L = kv.stats().get("visible_tokens") or 72360
    H, D, P = kv.num_heads, kv.head_dim, kv.page_size
    m = -(-L // P)
    k = kv.k_pool[0][:m].reshape(m * P, H, D)[:L]
    v = kv.v_pool[0][:m].reshape(m * P, H, D)[:L]
    q = torch.randn(1005, H, D, device="cuda", dtype=k.dtype)
    for label, (qq, kk, vv) in {
        "views [1,H,L,D] of NHD": tuple(x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)),
        "contiguous [1,H,L,D]": tuple(x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v)),
    }.items():
        for _ in range(3):
            torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(20):
            torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
        torch.cuda.synchronize()
        print(f"SDPA alone, {label}, L={L}: {1e3 * (time.perf_counter() - t) / 20:.3f} ms")


if __name__ == "__main__":
    main()
