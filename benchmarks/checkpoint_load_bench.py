"""Peak memory of loading a large synthetic checkpoint, per file format and load mode
(docs/benchmarks_checkpoint.md). A benchmark, not a test: it prints and records figures.

    python -m benchmarks.checkpoint_load_bench --size-gb SIZE [--ckpt-dtype bf16] [--modes ...] --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_load_bench",
                                description="Write a synthetic checkpoint of the given size in each format, "
                                            "load it into a matching model in a fresh process and report "
                                            "peak RSS relative to the file size.")
    p.add_argument("--size-gb", type=float, default=1.5, help="checkpoint size in GB (default 1.5)")
    p.add_argument("--formats", default="pt,safetensors", help="comma list of pt, safetensors (default both)")
    p.add_argument("--ckpt-dtype", default="fp32", choices=["fp32", "bf16"], help="dtype stored in the file")
    p.add_argument("--modes", default="copy,meta-assign,naive",
                   help="comma list: copy (load_checkpoint into an allocated fp32 model), meta-assign "
                        "(load_checkpoint into a meta-device model), naive (whole-file load + load_state_dict)")
    p.add_argument("--dir", help="scratch folder for the files (default: a temporary folder, removed after)")
    p.add_argument("--json", dest="json_out", help="also write the figures to this JSON file")
    return p.parse_args(argv)


# Each measurement runs in a fresh interpreter so its peak RSS (VmHWM) belongs to that load alone.

_TENSOR_SHAPE = (4096, 1024)   # 16.8 MB in fp32: a LingBot-Map MLP weight


def _bench_load(args) -> int:
    import platform
    import shutil
    import subprocess
    import tempfile

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [f for f in formats if f not in ("pt", "safetensors")] + [m for m in modes if m not in ("copy", "meta-assign", "naive")]
    if bad:
        print(f"error: unknown format/mode: {', '.join(bad)}", file=sys.stderr)
        return 2
    n_tensors = max(1, round(args.size_gb * 1e9 / (4 * _TENSOR_SHAPE[0] * _TENSOR_SHAPE[1])))
    workdir = args.dir or tempfile.mkdtemp(prefix="reconstudio-bench-load-")
    os.makedirs(workdir, exist_ok=True)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def child(spec: dict) -> dict:
        out = subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_load_bench", "_child", json.dumps(spec)],
                             capture_output=True, text=True, env=env, cwd=repo)
        if out.returncode != 0:
            raise RuntimeError(f"benchmark child failed: {out.stderr.strip()[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    rows = []
    try:
        for fmt in formats:
            path = os.path.join(workdir, f"synthetic.{'pt' if fmt == 'pt' else 'safetensors'}")
            child({"op": "write", "path": path, "format": fmt, "n": n_tensors, "dtype": args.ckpt_dtype})
            for mode in modes:
                r = child({"op": "load", "path": path, "format": fmt, "n": n_tensors, "mode": mode})
                r.update(format=fmt, mode=mode, ckpt_dtype=args.ckpt_dtype)
                rows.append(r)
                _print_row(r)
            os.remove(path)
    finally:
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
              "python": platform.python_version(), "rows": rows}
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _print_row(r: dict) -> None:
    gib = 2 ** 30
    f = r["file_bytes"]
    print(f"{r['format']:<11} {r['mode']:<11} file {f / gib:5.2f} GiB {r['ckpt_dtype']} | RSS before {r['base_rss'] / gib:5.2f} GiB, "
          f"peak {r['peak_rss'] / gib:5.2f} GiB (+{(r['peak_rss'] - r['base_rss']) / f:4.2f}× file) | "
          f"anon before {r['model_anon'] / gib:5.2f} GiB, peak {r['peak_anon'] / gib:5.2f} GiB "
          f"(+{(r['peak_anon'] - r['model_anon']) / f:4.2f}× file) | after {r['end_rss'] / gib:5.2f} GiB | "
          f"{r['seconds']:.2f} s", flush=True)


def _proc_status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def _bench_child(spec: dict) -> dict:
    import threading
    import time

    import torch

    from engine.checkpoint import load_checkpoint

    n, path = spec["n"], spec["path"]
    names = [f"blocks.{i}.mlp.fc1.weight" for i in range(n)]
    if spec["op"] == "write":
        dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
        g = torch.Generator().manual_seed(0)
        sd = {k: torch.randn(_TENSOR_SHAPE, generator=g).to(dtype) for k in names}
        if spec["format"] == "pt":
            torch.save(sd, path)
        else:
            from safetensors.torch import save_file
            save_file(sd, path)
        return {"written": path}

    class Synthetic(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            self.blocks = torch.nn.ModuleList()
            for _ in range(n):
                blk = torch.nn.Module()
                blk.mlp = torch.nn.Module()
                blk.mlp.fc1 = torch.nn.Module()
                blk.mlp.fc1.weight = torch.nn.Parameter(torch.empty(_TENSOR_SHAPE, device=device))
                self.blocks.append(blk)

    mode = spec["mode"]
    model = Synthetic("meta" if mode == "meta-assign" else "cpu")
    if mode != "meta-assign":
        for p in model.parameters():
            p.data.fill_(0.5)            # make every page resident: the baseline is a real model
    base = _proc_status()
    peak = {"anon": base["RssAnon"]}
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak["anon"] = max(peak["anon"], _proc_status()["RssAnon"])
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    if mode == "naive":
        if spec["format"] == "pt":
            sd = torch.load(path, map_location="cpu", weights_only=True)
        else:
            from safetensors.torch import load_file
            sd = load_file(path)
        model.load_state_dict(sd)
        del sd
    else:
        load_checkpoint(model, path)
    seconds = time.perf_counter() - t0
    done.set()
    t.join()
    end = _proc_status()
    # sanity: the load really happened (first element of the first tensor differs from the fill)
    assert float(next(model.parameters()).flatten()[0]) != 0.5
    return {"file_bytes": os.path.getsize(path), "model_anon": base["RssAnon"], "base_rss": base["VmRSS"],
            "peak_rss": end["VmHWM"], "peak_anon": max(peak["anon"], end["RssAnon"]),
            "end_rss": end["VmRSS"], "end_anon": end["RssAnon"], "seconds": seconds}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "_child":
        print(json.dumps(_bench_child(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(_bench_load(parse_args()))
