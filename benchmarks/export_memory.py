"""Peak memory and time of re-exporting long sessions (`reconstudio run SESSION --ply ...`).

Builds the sessions once with the synthetic engine (dense 518 x 392 depth per frame, the neural
engines' size) from the sample clip looped, then re-exports each in a fresh process per case and
prints one row per case: peak RSS of the export process (getrusage of that child alone) and wall
time. Sessions live under --root (default /tmp/reconstudio-export-bench), never in the repository.

    python benchmarks/export_memory.py                      # this checkout, 10,000 + 1,500 frames
    python benchmarks/export_memory.py --code /work/main    # the same cases on another checkout
    python benchmarks/export_memory.py --sessions long --cases trajectory
    python benchmarks/export_memory.py --sessions dense --cases colmap     # COLMAP with tracks

Figures and hardware: docs/benchmarks_io.md ("Exports in bounded memory").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLIP = REPO / "resources" / "sample" / "icl_livingroom_kt3.mp4"
SESSIONS = {"long": 10_000, "dense": 1_500}
# (name, export flags); OUT is replaced by the case's output folder
CASES = {
    "trajectory": ["--trajectory", "OUT/t.txt"],
    "ply+trajectory": ["--ply", "OUT/p.ply", "--trajectory", "OUT/t.txt"],
    "colmap": ["--colmap", "OUT/colmap", "--max-points", "2000000"],
    "all": ["--trajectory", "OUT/t.txt", "--colmap", "OUT/colmap", "--ply", "OUT/p.ply", "--glb", "OUT/s.glb",
            "--npz", "OUT/a.npz", "--max-points", "2000000"],
}

# runs one command and prints its own child's peak RSS: RUSAGE_CHILDREN of a fresh process
_MEASURE = ("import resource, subprocess, sys, time, json; t = time.perf_counter(); "
            "rc = subprocess.call(sys.argv[1:]); "
            "print(json.dumps({'rc': rc, 'wall_s': time.perf_counter() - t, "
            "'max_rss_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))")


def _env(code: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONDONTWRITEBYTECODE="1")
    env.pop("RECONSTUDIO_SESSIONS", None)
    return env


def build(folder: Path, frames: int, code: Path, python: str) -> None:
    if (folder / "config.json").exists() and len(list((folder / "frames").glob("*.npz"))) >= frames:
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    print(f"building {folder} ({frames} frames, synthetic engine)...", file=sys.stderr, flush=True)
    subprocess.run([python, "-m", "app", "run", str(CLIP), "--loop", "--engine", "synthetic",
                    "--max-frames", str(frames), "--session-dir", str(folder), "--quiet"],
                   cwd=code, env=_env(code), check=True)


def measure(session: Path, flags: list, out: Path, code: Path, python: str) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [python, "-m", "app", "run", str(session), "--quiet", *[f.replace("OUT", str(out)) for f in flags]]
    res = subprocess.run([python, "-c", _MEASURE, *cmd], cwd=code, env=_env(code),
                         capture_output=True, text=True)
    row = json.loads(res.stdout.strip().splitlines()[-1])
    row["stderr_tail"] = res.stderr.strip().splitlines()[-2:]
    row["bytes_out"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/reconstudio-export-bench"))
    ap.add_argument("--code", type=Path, default=REPO, help="checkout whose `reconstudio run` is measured")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--sessions", nargs="+", default=list(SESSIONS), choices=list(SESSIONS))
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    print(f"code {args.code}, {os.cpu_count()} CPUs", file=sys.stderr)
    for name in args.sessions:
        folder = args.root / f"{name}{SESSIONS[name]}"
        build(folder, SESSIONS[name], REPO, args.python)      # sessions are built by this checkout
        n = len(list((folder / "frames").glob("*.npz")))
        for case in args.cases:
            row = measure(folder, CASES[case], args.root / f"out-{name}-{case}-{os.getpid()}", args.code, args.python)
            print(f"{name:6s} {n:6d} frames  {case:15s} rc {row['rc']}  peak RSS {row['max_rss_mb']:8.0f} MB  "
                  f"{row['wall_s']:7.1f} s  {n / row['wall_s']:7.1f} frames/s  output "
                  f"{row['bytes_out'] / 1e6:8.1f} MB", flush=True)
            if row["rc"]:
                print("   " + " | ".join(row["stderr_tail"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
