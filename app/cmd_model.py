"""`reconstudio model ...`: checkpoint tools.

  model inspect PATH        what a checkpoint holds and whether it fits the LingBot-Map architecture
                            (exit 0 fits, 1 does not fit, 2 unreadable or refused)
  model list                the released checkpoints the app knows how to download
  model download [NAME]     fetch a released checkpoint from the Hugging Face hub (tqdm progress)
  model bench-load          benchmark: peak memory of loading a large synthetic checkpoint

Nothing heavy is imported at module level (the CLI builds every subcommand's parser).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

_FORMAT_NAMES = {
    "pt": "PyTorch zip (torch.save), read with weights_only=True, memory-mapped",
    "pt-legacy": "PyTorch legacy (pre-1.6 torch.save), read with weights_only=True",
    "safetensors": "safetensors, memory-mapped",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("inspect", help="show what a checkpoint holds and whether it fits the architecture",
                       description="Print format, wrapper, tensor count, dtypes, size and key prefixes of a "
                                   "checkpoint, and compare it with the LingBot-Map architecture. Exit code: "
                                   "0 fits, 1 does not fit, 2 unreadable or refused (e.g. a pickle that would "
                                   "run code).")
    p.add_argument("path", help="checkpoint file (.pt / .pth / .safetensors)")
    p.add_argument("--arch", default=None,
                   help="architecture to compare with (default: vggt-1b for a file with a track head and no "
                        "scale token, else lingbot-map)")
    p.add_argument("--limit", type=int, default=10, metavar="N", help="names listed per problem kind (default 10)")
    p.add_argument("--keys", action="store_true", help="also list every tensor with its shape and dtype")

    sub.add_parser("list", help="list the released checkpoints known to ReconStudio")

    p = sub.add_parser("download", help="download a released checkpoint from the Hugging Face hub",
                       description="Download a released checkpoint (default: lingbot-map) from the Hugging "
                                   "Face hub into its cache, or into --dest. Prints the local path.")
    p.add_argument("name", nargs="?", default="lingbot-map", help="a name from `model list` (default lingbot-map)")
    p.add_argument("--repo", help="any hub model repository instead of a known name (with --file)")
    p.add_argument("--file", help="file name inside --repo")
    p.add_argument("--dest", help="folder to place the file in (default: the Hugging Face cache)")

    p = sub.add_parser("bench-load", help="benchmark: peak RAM of loading a large synthetic checkpoint",
                       description="Write a synthetic checkpoint of the given size in each format, load it "
                                   "into a matching model in a fresh process and report peak RSS relative to "
                                   "the file size. A benchmark, not a test: it prints and records figures.")
    p.add_argument("--size-gb", type=float, default=1.5, help="checkpoint size in GB (default 1.5)")
    p.add_argument("--formats", default="pt,safetensors", help="comma list of pt, safetensors (default both)")
    p.add_argument("--ckpt-dtype", default="fp32", choices=["fp32", "bf16"], help="dtype stored in the file")
    p.add_argument("--modes", default="copy,meta-assign,naive",
                   help="comma list: copy (load_checkpoint into an allocated fp32 model), meta-assign "
                        "(load_checkpoint into a meta-device model), naive (whole-file load + load_state_dict)")
    p.add_argument("--dir", help="scratch folder for the files (default: a temporary folder, removed after)")
    p.add_argument("--json", dest="json_out", help="also write the figures to this JSON file")


def main(args: argparse.Namespace) -> int:
    return {"inspect": _inspect, "list": _list, "download": _download, "bench-load": _bench_load}[args.action](args)


# --- inspect ---------------------------------------------------------------------------------

def _inspect(args) -> int:
    from engine.api import CheckpointError, EngineError
    from engine.checkpoint import architecture_shapes, compare_shapes, inspect_checkpoint

    try:
        info = inspect_checkpoint(args.path)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"file:       {info.path} ({_gb(info.file_bytes)})")
    print(f"format:     {_FORMAT_NAMES.get(info.format, info.format)}")
    wrapper = f"{info.wrapper!r}" if info.wrapper else "none (bare state dict)"
    if info.ignored_entries:
        wrapper += f"; other entries left alone: {', '.join(info.ignored_entries[:args.limit])}"
    print(f"wrapper:    {wrapper}")
    if info.stripped_prefix:
        print(f"prefix:     {info.stripped_prefix!r} removed from every key")
    print(f"tensors:    {info.num_tensors:,} ({info.num_values:,} values, {_gb(info.tensor_bytes)})")
    print("dtypes:     " + ", ".join(f"{d} ×{n}" for d, n in info.dtypes().items()))
    if info.dataless:
        print(f"note:       {info.dataless:,} tensors hold no data (saved from the meta device): "
              f"shapes only, this file cannot be loaded")
    if info.metadata:
        print("metadata:   " + ", ".join(f"{k}={v}" for k, v in list(info.metadata.items())[:8]))
    print("prefixes:")
    top = info.prefixes(1)
    second = info.prefixes(2)
    for prefix, n, values in top:
        print(f"  {prefix:<34} {n:>6,} tensors {values:>15,} values")
        subs = [(sp if sp != prefix else f"{prefix} (own)", sn, sv) for sp, sn, sv in second
                if sp == prefix or sp.startswith(prefix + ".")]
        if len(subs) > 1:
            for sp, sn, sv in subs:
                print(f"    {sp:<32} {sn:>6,} tensors {sv:>15,} values")
    if args.keys:
        print("keys:")
        for name, (shape, dtype) in info.tensors.items():
            print(f"  {name}\t{list(shape)}\t{dtype}")

    if args.arch is None:
        args.arch = _detect_arch(info.tensors)
    try:
        expected = architecture_shapes(args.arch)
    except EngineError as exc:
        print(f"error: cannot build the {args.arch} architecture to compare with: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # an unknown architecture name or a model bug: say so, do not crash
        print(f"error: cannot build the {args.arch} architecture to compare with: {exc}", file=sys.stderr)
        return 2
    diff = compare_shapes(info.shapes(), expected)
    print(f"architecture: {args.arch} ({len(expected):,} tensors)")
    ignored = diff.ignored_line()
    if diff.fits:
        note = "every tensor present with the right shape"
        if set(d for _, d in info.tensors.values()) - {"float32"}:
            note += "; dtypes are converted to the model's on load"
        print(f"result:     FITS — {note}")
        if ignored:
            print(f"            {ignored}")
        return 0
    print("result:     DOES NOT FIT")
    for line in diff.problem_lines(args.limit):
        print(f"  - {line}")
    if ignored:
        print(f"  - {ignored}")
    return 1


def _detect_arch(names) -> str:
    """VGGT files carry a track head and no scale token; LingBot-Map files have the scale token."""
    names = set(names)
    if "aggregator.scale_token" not in names and any(n.startswith("track_head.") for n in names):
        return "vggt-1b"
    return "lingbot-map"


# --- list / download -------------------------------------------------------------------------

def _list(args) -> int:
    from engine.hub import KNOWN_CHECKPOINTS, cached_checkpoint

    for ck in KNOWN_CHECKPOINTS:
        cached = cached_checkpoint(ck.repo_id, ck.filename)
        print(f"{ck.name:<20} {ck.repo_id}/{ck.filename}  ~{_gb(ck.size_bytes)}  engine {ck.engine}")
        print(f"{'':<20} {ck.description}" + (f"\n{'':<20} cached: {cached}" if cached else ""))
    return 0


def _download(args) -> int:
    from engine.api import EngineError
    from engine.hub import download_checkpoint, known_checkpoint

    try:
        if args.repo or args.file:
            if not (args.repo and args.file):
                print("error: --repo and --file go together", file=sys.stderr)
                return 2
            repo_id, filename = args.repo, args.file
        else:
            ck = known_checkpoint(args.name)
            repo_id, filename = ck.repo_id, ck.filename
            print(f"downloading {repo_id}/{filename} (~{_gb(ck.size_bytes)})", file=sys.stderr)
        path = download_checkpoint(repo_id, filename, dest_dir=args.dest)   # hub's own tqdm bar
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


# --- bench-load ------------------------------------------------------------------------------
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
        out = subprocess.run([sys.executable, "-m", "app.cmd_model", "_bench-child", json.dumps(spec)],
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
    if len(sys.argv) == 3 and sys.argv[1] == "_bench-child":
        print(json.dumps(_bench_child(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit("usage: reconstudio model ...")
