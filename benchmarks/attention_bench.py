"""One global-attention layer at the steady-state shape, each attention path on the SAME cache
and step (GPU; the figures go to docs/benchmarks.md):

    python3 benchmarks/attention_bench.py [--frames 300] [--reps 50] [--json OUT]

A one-layer PagedKVCache (bf16, 16 heads x 64, 999 patch tokens + 6 specials per frame, 8 scale
frames, window 64, special cap 1024) is streamed with random keys/values to `--frames` frames;
then, on the last keyframe step, each path attends the same q (1,005 tokens) to the same visible
set: FlashInfer dense (ragged wrapper over the zero-copy run; FA3 on Hopper), FlashInfer paged
(the page-table kernel), SDPA flash and cuDNN over the zero-copy view, and the cuDNN backend
(engine/kv/cudnn.py `CuDNNBackend`: the whole pool, fixed capacity, bias row; its
sequence-length form through the cuDNN frontend when installed), and the cuDNN split
(engine/kv/cudnn_split.py). Median of `--reps` CUDA-event timings per path, the rate in TFLOP/s
(4 * q * kv * heads * head_dim per call, kv = the visible tokens) and each path's relative
difference to the first one. Then cuDNN's wall time per call when the KV length changes every
call (as in the model) and with a fixed capacity plus a -inf tail mask; then `--steps` further
keyframe steps (the visible length changes every step, as in the model) with each backend's
plan + attend timed by wall clock, GPU included (what a frame pays, graph rebuilds included).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kv import PagedKVCache                                          # noqa: E402
from engine.kv.backends import FlashInferBackend, SDPABackend, flashinfer_available  # noqa: E402
from engine.kv.cudnn import CuDNNBackend, CuDNNSeqLenBackend  # noqa: E402
from engine.kv.cudnn_kernels import _import_cudnn_frontend, merge_lse, torch_cudnn, torch_flash_lse  # noqa: E402
from engine.kv.cudnn_split import CuDNNSplitBackend  # noqa: E402

H, D, P, S6 = 16, 64, 999, 6


def _median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in evs)[reps // 2]


def _wall_ms(calls) -> float:
    """Host wall time per call of `calls` (list of thunks), GPU included: what a frame pays when
    a call also rebuilds something on the host."""
    import time
    torch.cuda.synchronize()
    t = time.perf_counter()
    for c in calls:
        c()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t) / len(calls)


def _cudnn_lengths(cache, step, q, reps: int) -> list:
    """cuDNN in the model sees a new KV length every frame (+6 special tokens). Wall time per call
    (a) at one length, (b) at a new length each call, (c) at one fixed capacity (the run's whole
    pages) with the unused tail masked by an additive -inf bias, the length changing each call --
    whether a fixed-shape call keeps cuDNN's graph and its speed (the lead in docs/benchmarks.md)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    a0, m = step.contiguous
    L = step.num_kv_tokens
    kp = cache.pool.k[0, a0:a0 + m].reshape(m * P, H, D)
    vp = cache.pool.v[0, a0:a0 + m].reshape(m * P, H, D)
    qh = q.transpose(0, 1)[None]
    cap = m * P
    n = min(reps, (L - 1) // 6)
    lengths = [L - 6 * (n - 1 - i) for i in range(n)]
    masks = []
    for length in lengths:
        bias = torch.zeros(1, 1, 1, cap, dtype=q.dtype, device=q.device)
        bias[..., length:] = float("-inf")
        masks.append(bias)

    def call(length, bias=None):
        k = (kp if bias is not None else kp[:length]).transpose(0, 1)[None]
        v = (vp if bias is not None else vp[:length]).transpose(0, 1)[None]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qh, k, v, attn_mask=bias)

    rows = []
    tests = {"cudnn, one length (wall per call)": [lambda: call(L)] * n,
             "cudnn, new length every call (wall per call)": [lambda x=x: call(x) for x in lengths],
             "cudnn, fixed capacity + -inf tail mask, length changing (wall per call)":
                 [lambda x=x, b=b: call(x, b) for x, b in zip(lengths, masks)]}
    for name, calls in tests.items():
        try:
            for c in calls[:2]:
                c()
            if "mask" in name:          # the masked call must equal the plain one
                diff = float((call(L, masks[-1]).float() - call(L).float()).norm() / call(L).float().norm())
            else:
                diff = None
            ms = _wall_ms(calls)
        except Exception as exc:        # e.g. no bias support in this cuDNN / PyTorch
            print(f"{name:70s} failed: {type(exc).__name__}: {str(exc)[:200]}")
            rows.append({"path": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        rows.append({"path": name, "wall_ms": ms, "rel_diff_masked_vs_plain": diff, "capacity": cap})
        print(f"{name:70s} {ms:7.3f} ms" + (f"  masked vs plain {diff:.1e}" if diff is not None else ""))
    return rows


def _split_parts(paths, step, q, reps: int) -> list:
    """Where the split's time goes: its fixed part (cuDNN, with log-sum-exp), its variable part
    (flash over the special tokens), the merge, each timed alone on the same step."""
    rows = []
    for name, be in paths.items():
        if not isinstance(be, CuDNNSplitBackend):
            continue
        be.plan(step)
        if be._split is None or be.error:
            print(f"{name}: step not split ({be.error})")
            continue
        pool = be.cache.pool
        a0, na, b0, b = be._split[:4]        # flat slots: A's start and length, B's
        P = pool.page_size
        first, n_a = a0 // P, na // P
        ka, va = be._run(0, a0, na)
        kb, vb = be._run(0, b0, b)
        oa, la = be._kernel_a(q, ka, va)
        ob, lb = torch_flash_lse(q, kb, vb)
        merged = torch.compile(merge_lse, dynamic=False, fullgraph=True)
        parts = {"A (fixed run, cuDNN)": lambda: be._kernel_a(q, ka, va),
                 "B (specials, flash)": lambda: torch_flash_lse(q, kb, vb),
                 "merge": lambda: merge_lse(oa, la, ob, lb),
                 "merge, torch.compile": lambda: merged(oa, la, ob, lb)}
        n = n_a * P + b             # the whole run as one call without statistics (a full ring's form)
        m = -(-n // P)
        kw = pool.k[0, first:first + m].view(m * P, H, D)[:n]
        vw = pool.v[0, first:first + m].view(m * P, H, D)[:n]
        parts["whole run (cuDNN, no statistics)"] = lambda: torch_cudnn(q, kw, vw)
        ms = {k: _median_ms(f, reps) for k, f in parts.items()}
        print(f"{name}: A = {n_a} pages ({n_a * P} keys), B = {b} keys: " +
              ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))
        rows.append({"path": f"parts: {name}", "a_keys": n_a * P, "b_keys": b, **{f"{k} ms": v for k, v in ms.items()}})
    return rows


def _per_step_wall(cache, paths, kv, q, steps: int) -> list:
    """`steps` more keyframe steps (the visible length grows by 6 special tokens a step, as in the
    model): each backend plans the step and attends once, timed by wall clock with the GPU
    synchronised around it. A backend that rebuilds something per length (PyTorch's cuDNN graph
    over the visible keys) pays it here; the fixed-capacity cuDNN backend should not."""
    import time
    walls = {name: [] for name in paths}
    errors = {}
    for _ in range(steps):
        step = cache.begin_step(1)
        cache.write(0, *kv(1))
        for name, be in paths.items():
            if name in errors:
                continue
            torch.cuda.synchronize()
            t = time.perf_counter()
            try:
                be.plan(step)
                be.attend(step, q, 0)
                torch.cuda.synchronize()
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            walls[name].append(1e3 * (time.perf_counter() - t))
        cache.end_step()
    rows = []
    print(f"per step, {steps} keyframe steps, new visible length each (wall ms, plan + attend, median / max):")
    for name, w in walls.items():
        if name in errors or not w:
            print(f"  {name:44s} failed: {errors.get(name)}")
            rows.append({"path": f"per-step wall: {name}", "error": errors.get(name)})
            continue
        w = sorted(w)
        extra = {("taken" if k == "path" else k): getattr(paths[name], k) for k in ("path", "error")
                 if getattr(paths[name], k, None)}
        print(f"  {name:44s} {w[len(w) // 2]:7.3f} / {w[-1]:7.3f}  {extra}")
        rows.append({"path": f"per-step wall: {name}", "wall_ms_median": w[len(w) // 2], "wall_ms_max": w[-1],
                     "steps": len(w), **extra})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--patches", type=int, default=999,
                    help="patch tokens per frame: 999 at 518x378, 1036 at 518x392 (a 640x480 input)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--steps", type=int, default=30, help="steps of the per-step wall-time comparison")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="", help="comma-separated substrings: run only the paths whose name "
                                               "holds one (e.g. 'dense,sdpa,split'); default all")
    a = ap.parse_args(argv)
    global P
    P = a.patches
    cache = PagedKVCache(1, H, D, P, special_tokens=S6, scale_frames=8, window=64, special_cap=1024,
                         dtype=torch.bfloat16, device="cuda", backend="sdpa")
    # made before streaming: a CuDNNBackend zeroes the pool when it is created (as in a session)
    cudnn_row = CuDNNBackend(cache, min_fill=0.0)
    # the sequence-length form through the cuDNN frontend (CuDNNSeqLenBackend)
    seqlen = {}
    fe, fe_err = _import_cudnn_frontend()
    if fe is not None:
        print(f"cuDNN frontend {fe.__version__}, cuDNN backend {fe.backend_version()}")
        seqlen["cudnn frontend seq_len (dense)"] = CuDNNSeqLenBackend(cache)
    else:
        print(f"cuDNN frontend missing: {fe_err}")
    g = torch.Generator(device="cuda").manual_seed(0)

    def kv(n):
        return (torch.randn(n, S6 + P, H, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cache.begin_step(8, scale=True)
    cache.write(0, *kv(8))
    cache.end_step()
    for _ in range(8, a.frames - 1):
        cache.begin_step(1)
        cache.write(0, *kv(1))
        cache.end_step()
    step = cache.begin_step(1)
    cache.write(0, *kv(1))
    q = torch.randn(S6 + P, H, D, generator=g, device="cuda", dtype=torch.bfloat16)
    L = step.num_kv_tokens
    paths = {}
    if flashinfer_available():
        paths["flashinfer dense (ragged)"] = FlashInferBackend(cache, dense=True)
        paths["flashinfer paged"] = FlashInferBackend(cache, dense=False)
    from torch.nn.attention import SDPBackend
    paths["sdpa flash (zero-copy view)"] = SDPABackend(cache, kernels=[SDPBackend.FLASH_ATTENTION])
    paths["sdpa cudnn (zero-copy view)"] = SDPABackend(cache, kernels=[SDPBackend.CUDNN_ATTENTION])
    paths["cudnn backend (fixed capacity, bias row)"] = cudnn_row
    paths.update(seqlen)
    # the split: the patch-page run through plain cuDNN (one graph: its length is constant in the
    # steady state) + the special tokens through flash, merged by log-sum-exp (CuDNNSplitBackend)
    paths["cudnn split (torch cuDNN A + flash B)"] = CuDNNSplitBackend(cache)
    only = [x for x in a.only.split(",") if x]
    if only:
        paths = {k: v for k, v in paths.items() if any(x in k for x in only)}
        seqlen = {k: v for k, v in seqlen.items() if k in paths}
    flop = 4.0 * q.shape[0] * L * H * D
    rows, ref, outs = [], None, {}
    print(f"visible tokens {L}, q tokens {q.shape[0]}, contiguous run {step.contiguous}, "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for name, be in paths.items():
        try:
            be.plan(step)
            out = be.attend(step, q, 0)
            ms = _median_ms(lambda: be.attend(step, q, 0), a.reps)
        except Exception as exc:        # report and go on with the other paths
            print(f"{name:32s} failed: {type(exc).__name__}: {str(exc)[:300]}")
            rows.append({"path": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        ref = out.float() if ref is None else ref
        outs[name] = out.float()
        diff = float((out.float() - ref).norm() / ref.norm())
        # the backend's own path ("dense", "fixed", ...) under its own key: "path" names the row
        extra = {("taken" if k == "path" else k): getattr(be, k) for k in
                 ("kernel", "path", "capacity", "error", "mode", "form", "forms") if getattr(be, k, None)}
        sd = outs.get("sdpa flash (zero-copy view)")
        if sd is not None:       # bf16 agreement with SDPA, as the GPU tests check it (2e-2)
            extra["rel_diff_to_sdpa_flash"] = float((out.float() - sd).norm() / sd.norm())
            extra["max_abs_diff_to_sdpa_flash"] = float((out.float() - sd).abs().max())
        rows.append({"path": name, "ms": ms, "tflops": flop / ms / 1e9, "rel_diff_to_first": diff, **extra})
        print(f"{name:32s} {ms:7.3f} ms  {flop / ms / 1e9:6.0f} TFLOP/s  rel diff {diff:.1e}  {extra}")
    for name, be in seqlen.items():
        print(f"{name}: graphs built {getattr(be._kernel, 'builds', None)}, steps per form {be.forms}")
    rows += _split_parts(paths, step, q, a.reps)
    if not only or any("length" in x for x in only):
        rows += _cudnn_lengths(cache, step, q, a.reps)
    cache.end_step()
    rows += _per_step_wall(cache, paths, kv, q, a.steps)
    if a.json:
        Path(a.json).write_text(json.dumps({"visible_tokens": L, "q_tokens": q.shape[0], "frames": a.frames,
                                            "gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
