"""`reconstudio bench`: FPS, latency, GPU memory and a per-part time breakdown of the streaming
LingBot-Map engine, on random / recipe / checkpoint weights; `--sweep` writes a memory CSV.

Examples:
    reconstudio bench --device cuda --dtype bf16 --frames 300 --breakdown
    reconstudio bench --device cuda --sweep 64,1000,2000,5000,10000 --csv sweep.csv --json sweep.json
    reconstudio bench --model lingbot-map-tiny --device cpu --dtype fp32 --resolution 70x56 --frames 20
"""
from __future__ import annotations

import argparse
import sys


def _resolution(text: str) -> tuple:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"resolution must look like 518x378, got {text!r}") from None
    if w < 14 or h < 14 or w % 14 or h % 14:
        raise argparse.ArgumentTypeError(f"resolution {text} must be multiples of 14 (e.g. 518x378)")
    return w, h


def _counts(text: str) -> list:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep takes frame counts like 64,1000,10000, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("--sweep counts must be positive")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("--model", default="lingbot-map", help="model name (lingbot-map, lingbot-map-tiny)")
    p.add_argument("--weights", default="random",
                   help="random (fast init), recipe (the fixtures' deterministic weights) or a checkpoint path")
    p.add_argument("--resolution", type=_resolution, default=None, metavar="WxH",
                   help="model input size, multiples of 14 (default 518x378 = 37x27 patches)")
    p.add_argument("--image-width", type=int, default=None,
                   help="model input width; the height keeps the 518:378 aspect (ignored with --resolution)")
    p.add_argument("--frames", type=int, default=300, help="frames to stream (default 300)")
    p.add_argument("--warmup", type=int, default=30, help="streamed frames left out of steady-state figures")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--scale-frames", type=int, default=8)
    p.add_argument("--keyframe-interval", type=int, default=1)
    p.add_argument("--camera-iterations", type=int, default=4)
    p.add_argument("--special-cap", type=int, default=1024)
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--kv-dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--backend", default="auto", choices=["auto", "sdpa", "flashinfer"])
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--breakdown", action="store_true",
                   help="time patch embed / frame blocks / global blocks / global attention / heads (CUDA events)")
    p.add_argument("--sweep", type=_counts, default=None, metavar="N1,N2,...",
                   help="record a row (time, FPS, peak memory, KV pages) at each frame count of one long stream")
    p.add_argument("--csv", default=None, help="write the sweep rows here (default bench_sweep.csv with --sweep)")
    p.add_argument("--json", default=None, help="write every figure here as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_true", default=None,
                   help="replay the fixed-shape parts (patch embed, frame blocks, depth head) as CUDA graphs")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="run every part eagerly")


def main(args: argparse.Namespace) -> int:
    import torch

    from engine.api import EngineError
    from engine.bench import BenchConfig, CsvRows, format_report, height_for_width, run_bench, write_json

    if args.resolution:
        w, h = args.resolution
    elif args.image_width:
        if args.image_width < 14 or args.image_width % 14:
            print(f"bench: --image-width must be a positive multiple of 14 (got {args.image_width})", file=sys.stderr)
            return 2
        w, h = args.image_width, height_for_width(args.image_width)
    else:
        w, h = 518, 378
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = BenchConfig(model=args.model, weights=args.weights, width=w, height=h, frames=args.frames,
                      warmup=args.warmup, window=args.window, scale_frames=args.scale_frames,
                      keyframe_interval=args.keyframe_interval, camera_iterations=args.camera_iterations,
                      special_cap=args.special_cap, dtype=args.dtype, kv_dtype=args.kv_dtype,
                      backend=args.backend, device=device, breakdown=args.breakdown,
                      sweep=args.sweep or [], seed=args.seed, cuda_graphs=args.cuda_graphs)
    rows = CsvRows(args.csv or "bench_sweep.csv") if args.sweep else None
    try:
        res = run_bench(cfg, on_row=rows)
    except EngineError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    finally:
        if rows is not None:
            rows.close()
    print(format_report(res))
    if rows is not None:
        print(f"sweep rows written to {args.csv or 'bench_sweep.csv'}")
    if args.json:
        write_json(res, args.json)
        print(f"figures written to {args.json}")
    return 0
