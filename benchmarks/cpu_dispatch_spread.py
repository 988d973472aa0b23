"""Spread of the engine tests' accuracy values across instruction sets (issue 24): runs the tests
whose assertions go through tests/engine/accuracy.py `check` once per CPU configuration, each in a
fresh process whose libraries are switched to other kernels through their own switches, and prints
one table: the value per configuration, the test's limit, the spread and the headroom.

    python3 benchmarks/cpu_dispatch_spread.py [--configs native,no-avx2,sse3] [--json OUT] [TEST ...]

Configurations (a machine cannot emulate more than it has; these go DOWN from the host's set):
  native   the host as it is.
  1-thread OpenCV, OpenBLAS and torch on one thread (results must not depend on thread counts).
  no-avx2  OpenCV's dispatch without AVX/AVX2/FMA3 (OPENCV_CPU_DISABLE) and IPP at SSE4.2
           (OPENCV_IPP), numpy's dispatch at its baseline (NPY_DISABLE_CPU_FEATURES=X86_V3),
           OpenBLAS's Sandybridge kernels (OPENBLAS_CORETYPE), torch / oneDNN / MKL at their
           default or SSE4.x paths.
  sse3     OpenCV at its SSE3 baseline (SSSE3..AVX2 off) and IPP off, OpenBLAS's Core2 kernels,
           numpy and torch as in no-avx2.
  opencv-sse3 / blas-core2   only OpenCV (as in sse3), or only OpenBLAS + numpy (as in sse3),
           lowered: which library moves a value. (An ARM machine or an OpenCV built without IPP
           runs the portable kernels too.)
The header lists what each configuration really ran (OpenCV features, IPP, OpenBLAS core, numpy
targets), read back in the child process.

Headroom = (limit - worst) / |worst| for an upper limit ((worst - limit) / |worst| for a lower
one), worst over the configurations run. The margin rule of tests/engine/accuracy.py asks for
headroom >= max(2 * spread / |worst|, 10 %); rows below it are marked TIGHT, failing ones FAIL.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = ["tests/engine/test_geometric_loop_flow.py", "tests/engine/test_geometric_loop.py",
         "tests/engine/test_geometric_memory.py", "tests/engine/test_geometric_reuse.py",
         "tests/engine/test_geometric_session.py", "tests/engine/test_geometric_depth.py",
         "tests/engine/test_geometric_synthetic.py", "tests/engine/test_geometric_startup.py",
         "tests/engine/test_eval.py", "tests/engine/test_windowed.py", "tests/engine/test_align.py"]

_LOWER = {"NPY_DISABLE_CPU_FEATURES": "X86_V3", "ATEN_CPU_CAPABILITY": "default",
          "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
CONFIGS = {
    "native": {},
    "1-thread": {"OPENCV_FOR_THREADS_NUM": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                 "MKL_NUM_THREADS": "1"},
    "no-avx2": {"OPENCV_CPU_DISABLE": "AVX,AVX2,FMA3,FP16", "OPENCV_IPP": "sse42",
                "OPENBLAS_CORETYPE": "Sandybridge", **_LOWER},
    "sse3": {"OPENCV_CPU_DISABLE": "SSSE3,SSE4.1,SSE4.2,POPCNT,AVX,AVX2,FMA3,FP16", "OPENCV_IPP": "disabled",
             "OPENBLAS_CORETYPE": "Core2", **_LOWER},
    # one library at a time (which one moves a value)
    "opencv-sse3": {"OPENCV_CPU_DISABLE": "SSSE3,SSE4.1,SSE4.2,POPCNT,AVX,AVX2,FMA3,FP16", "OPENCV_IPP": "disabled"},
    "blas-core2": {"OPENBLAS_CORETYPE": "Core2", "NPY_DISABLE_CPU_FEATURES": "X86_V3"},
}

# run in the child: what the libraries actually dispatch to under the configuration's switches
PROBE = r"""
import ctypes, json, re
import numpy as np, cv2
import numpy._core._multiarray_umath as U
np.ones((8, 8)) @ np.ones((8, 8))
cores = {}   # numpy's OpenBLAS and OpenCV's own copy
for line in open('/proc/self/maps'):
    m = re.search(r'(/\S*openblas\S*\.so\S*)', line)
    if m and m.group(1) not in cores:
        lib = ctypes.CDLL(m.group(1))
        for sym in ('scipy_openblas_get_corename64_', 'openblas_get_corename64_', 'openblas_get_corename'):
            if hasattr(lib, sym):
                f = getattr(lib, sym); f.restype = ctypes.c_char_p; cores[m.group(1)] = f().decode(); break
core = "/".join(sorted(set(cores.values())))
ids = dict(SSE4_1=6, SSE4_2=7, AVX=10, AVX2=11, FMA3=12, AVX512F=13)
found = [k for k in ('X86_V2', 'X86_V3', 'X86_V4', 'AVX512_ICL', 'AVX512_SPR') if U.__cpu_features__.get(k)]
print(json.dumps({"opencv": cv2.__version__, "opencv_features": [n for n, i in ids.items() if cv2.checkHardwareSupport(i)],
                  "ipp": cv2.ipp.getIppVersion() if cv2.ipp.useIPP() else "off", "opencv_threads": cv2.getNumThreads(),
                  "openblas_core": core, "numpy": np.__version__, "numpy_targets": found}))
"""


def _env(cfg: dict, log: str) -> dict:
    env = dict(os.environ)
    for k in set().union(*CONFIGS.values()):
        env.pop(k, None)
    env.update(cfg)
    env.update(RECONSTUDIO_ACCURACY_LOG=log, RECONSTUDIO_BLOCK_QT="1", PYTHONPATH=str(ROOT))
    return env


def run_config(name: str, tests: list[str]) -> tuple[dict, list[dict], str]:
    with tempfile.TemporaryDirectory() as tmp:
        log = str(Path(tmp) / "acc.jsonl")
        env = _env(CONFIGS[name], log)
        probe = json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, check=True,
                                          capture_output=True, text=True).stdout)
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:pytest-qt", "-p", "no:cacheprovider",
                            *tests], env=env, cwd=ROOT, capture_output=True, text=True)
        summary = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
        rows = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
    return probe, rows, summary


def headroom(op: str, worst: float, limit: float) -> float:
    scale = abs(worst) or 1e-300
    return (limit - worst) / scale if op in ("<", "<=") else (worst - limit) / scale


def table(results: dict) -> str:
    """Rows and limits are those of the first configuration (the tests as they are now when it was
    run); the others contribute their values."""
    names = list(results)
    keys = {(r["test"], r["name"]): (r["op"], r["limit"]) for r in results[names[0]]["rows"]}
    head = "| test | value | " + " | ".join(names) + " | limit | spread | headroom | rule |"
    out = [head, "|" + " --- |" * (len(names) + 6)]
    for (test, name), (op, limit) in keys.items():
        vals = []
        for cfg in names:
            v = [r["value"] for r in results[cfg]["rows"] if (r["test"], r["name"]) == (test, name)]
            vals.append(v[0] if v else None)
        got = [v for v in vals if v is not None]
        worst = max(got) if op in ("<", "<=") else min(got)
        spread = max(got) - min(got)
        h = headroom(op, worst, limit)
        need = max(2 * spread / (abs(worst) or 1e-300), 0.1)
        mark = "FAIL" if h <= 0 else ("ok" if h >= need - 1e-9 else "TIGHT")
        short = test.replace("tests/engine/", "").replace(".py::", "::")
        cells = " | ".join("—" if v is None else f"{v:.4g}" for v in vals)
        out.append(f"| {short} | {name} | {cells} | {op} {limit:g} | {spread:.2g} | {100 * h:.0f} % | {mark} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", nargs="*", default=TESTS)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", type=Path, help="write the raw values and probes here")
    ap.add_argument("--merge", type=Path, nargs="*", default=[], help="earlier --json files: their configurations "
                    "join the table (a configuration run now, or merged earlier, takes precedence)")
    a = ap.parse_args(argv)
    results = {}
    for name in [c for c in a.configs.split(",") if c]:
        probe, rows, summary = run_config(name, a.tests)
        results[name] = {"probe": probe, "rows": rows, "pytest": summary, "env": CONFIGS[name]}
        print(f"{name}: {summary}; OpenCV {probe['opencv']} {'+'.join(probe['opencv_features']) or 'SSE3'}, "
              f"IPP {probe['ipp']}, {probe['opencv_threads']} threads; OpenBLAS {probe['openblas_core']}; "
              f"numpy {probe['numpy']} {'+'.join(probe['numpy_targets'])}", flush=True)
    for path in a.merge:
        for name, res in json.loads(path.read_text()).items():
            results.setdefault(name, res)
    print()
    print(table(results))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
