"""PyTorch's cuDNN attention (no mask, with log-sum-exp: the cuDNN split's fixed part) for a few
query counts and head counts at one K/V length, to see the wave quantisation behind
`CuDNNSplitBackend.fits_one_wave`: ceil(q / 128) x heads work tiles against the GPU's SMs; then
the wave tail (`--tail`, default on): a 640x480 input's 1,042 rows split into the 1,024 one wave
takes and 18 attended in key chunks (`chunked_lse`, flash or cuDNN form, a few chunk counts),
against the single two-wave call.

    python3 benchmarks/cudnn_wave_bench.py [--kv 74592] [--reps 50] [--no-tail]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_bench import _median_ms         # noqa: E402  (CUDA-event median, shared)
from engine.kv.cudnn_kernels import (chunk_bounds, chunked_lse, even_chunks, tail_chunks,   # noqa: E402
                             torch_cudnn_lse)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", type=int, default=74592)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-tail", dest="tail", action="store_false")
    a = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}: {sms} SMs; K/V {a.kv} tokens, head dim 64, bf16")
    g = torch.Generator(device="cuda").manual_seed(0)
    for heads, q_tokens in ((16, 1005), (16, 1024), (16, 1025), (16, 1042), (8, 1042), (16, 521)):
        q = torch.randn(q_tokens, heads, 64, generator=g, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(a.kv, heads, 64, generator=g, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        ms = _median_ms(lambda: torch_cudnn_lse(q, k, v), a.reps)
        tiles = -(-q_tokens // 128) * heads
        tflops = 4 * q_tokens * a.kv * heads * 64 / ms / 1e9
        print(f"heads {heads:2d}  q {q_tokens:5d}  tiles {tiles:4d} ({'one wave' if tiles <= sms else 'two waves'})  "
              f"{ms:.3f} ms  {tflops:.0f} TFLOP/s")
    if a.tail:
        tail(a, sms, g)


def _graph_ms(fn, reps: int) -> float:
    """Median GPU time of `fn` replayed from a CUDA graph (the small merge kernels of the tail
    would otherwise be timed with the host's launch gaps; in the model they run inside graphs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _median_ms(graph.replay, reps)


def tail(a, sms: int, g) -> None:
    """1,042 rows, 16 heads: one two-wave call; 1,024 rows alone; the 18-row tail alone in each
    form and chunk count; main + tail + the row concatenation (what `_wave_tail` runs). All
    timed as CUDA-graph replays (`_graph_ms`)."""
    heads, n, rows = 16, 1042, (sms // 16) * 128
    t = n - rows
    q = torch.randn(n, heads, 64, generator=g, device="cuda", dtype=torch.bfloat16)
    print(f"wave tail: q {n} = {rows} (one wave) + {t} rows")
    for kv in sorted({a.kv, 72 * 1036, 73 * 1036, 72 * 1036 + 6150}):
        k = torch.randn(kv, heads, 64, generator=g, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        pick = tail_chunks(t, heads, sms, kv)
        full = _graph_ms(lambda: torch_cudnn_lse(q, k, v), a.reps)
        main_ms = _graph_ms(lambda: torch_cudnn_lse(q[:rows], k, v), a.reps)
        line = [f"kv {kv}: two-wave call {full:.3f} ms, {rows} rows {main_ms:.3f} ms; tail (chosen {pick})"]
        for c in sorted({1, 4, pick, 16}):
            c = tail_chunks(t, heads, 16 * c, kv)            # a valid count near c
            b = chunk_bounds(t, kv, c, q.device)
            ms = _graph_ms(lambda: chunked_lse(q[rows:], k, v, c, b), a.reps)
            line.append(f"flash x{c} {ms:.3f}")
        e = even_chunks(kv, pick)
        ms_c = _graph_ms(lambda: chunked_lse(q[rows:], k, v, e, kernel="cudnn"), a.reps)
        line.append(f"cudnn x{e} {ms_c:.3f}")
        b = chunk_bounds(t, kv, pick, q.device)

        def both(kind):
            om, lm = torch_cudnn_lse(q[:rows], k, v)
            ot, lt = (chunked_lse(q[rows:], k, v, pick, b) if kind == "flash"
                      else chunked_lse(q[rows:], k, v, e, kernel="cudnn"))
            return torch.cat([om, ot]), torch.cat([lm, lt], dim=1)
        line.append(f"| main+tail flash {_graph_ms(lambda: both('flash'), a.reps):.3f}, "
                    f"cudnn {_graph_ms(lambda: both('cudnn'), a.reps):.3f} ms")
        print("  " + ", ".join(line))


if __name__ == "__main__":
    main()
