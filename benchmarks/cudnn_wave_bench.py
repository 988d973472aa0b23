"""PyTorch's cuDNN attention (no mask, with log-sum-exp: the cuDNN split's fixed part) for a few
query counts and head counts at one K/V length, to see the wave quantisation behind
`CuDNNSplitBackend.fits_one_wave`: ceil(q / 128) x heads work tiles against the GPU's SMs.

    python3 benchmarks/cudnn_wave_bench.py [--kv 74592] [--reps 50]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_bench import _median_ms         # noqa: E402  (CUDA-event median, shared)
from engine.kv.cudnn import torch_cudnn_lse     # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", type=int, default=74592)
    ap.add_argument("--reps", type=int, default=50)
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


if __name__ == "__main__":
    main()
