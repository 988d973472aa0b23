"""One RESULT line per bench or run of benchmarks/h200_end_to_end.sh, and the table of a whole log.

    python3 benchmarks/e2e_report.py bench BENCH.json NAME     # steady FPS of `reconstudio bench`
    python3 benchmarks/e2e_report.py run STATS.csv NAME        # a `reconstudio run --stats-csv` file
    python3 benchmarks/e2e_report.py table run.log             # run / bench per variant and repeat

A run's figure is the median of `engine_fps` (results per wall second, recent) over the last two
thirds of its one-second rows: the first third holds the model load, CUDA graphs and scale phase.
"""
from __future__ import annotations

import csv
import json
import re
import statistics
import sys


def bench_line(path: str, name: str) -> str:
    d = json.load(open(path))
    return f"RESULT bench {name} {d['fps_steady']:.2f}"


def run_line(path: str, name: str) -> str:
    rows = [r for r in csv.DictReader(open(path)) if r.get("engine_fps")]
    rows = rows[len(rows) // 3:]

    def med(k):
        vals = [float(r[k]) for r in rows if r.get(k)]
        return statistics.median(vals) if vals else float("nan")

    return (f"RESULT run {name} {med('engine_fps'):.2f} (read_ms {med('read_ms'):.2f} push_ms {med('push_ms'):.2f} "
            f"sinks_ms {med('sinks_ms'):.2f})")


def table(log: str) -> str:
    got: dict = {}
    for m in re.finditer(r"^RESULT (bench|run) (\S+) ([\d.]+)", open(log).read(), re.M):
        got.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    out = ["| variant, repeat | bench steady FPS | run frames/s | run / bench |", "| --- | --- | --- | --- |"]
    for name, d in got.items():
        b, r = d.get("bench"), d.get("run")
        ratio = f"{100 * r / b:.1f} %" if b and r else "-"
        out.append(f"| {name} | {b if b is not None else '-'} | {r if r is not None else '-'} | {ratio} |")
    return "\n".join(out)


if __name__ == "__main__":
    kind = sys.argv[1]
    if kind == "bench":
        print(bench_line(sys.argv[2], sys.argv[3]))
    elif kind == "run":
        print(run_line(sys.argv[2], sys.argv[3]))
    else:
        print(table(sys.argv[2]))
