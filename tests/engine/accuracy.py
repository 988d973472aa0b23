"""Accuracy assertions of the engine tests, recorded so their margins can be measured.

A result computed through OpenCV or BLAS (ATE, RPE, depth error, a fitted scale...) differs in its
last bits between instruction sets (AVX2 / AVX-512 / SSE kernels, FMA or not), and a chaotic
pipeline (RANSAC inlier sets, keyframe decisions, loop verification) can turn those bits into
millimetres. So each such assertion goes through `check`, which appends the value and its limit to
the JSON-lines file named by RECONSTUDIO_ACCURACY_LOG (when set) before asserting. The script
benchmarks/cpu_dispatch_spread.py runs the tests under several instruction sets and tabulates the
values against the limits (docs/benchmarks_geometric.md, "Spread across instruction sets").

Margin rule (the limits in the tests follow it): a limit leaves, beyond the worst value measured over
the instruction sets, at least twice the measured spread (max - min) and at least 10 % of the worst
value -- `headroom = (limit - worst) / worst` in the table is then >= max(2 * spread / worst, 0.1).
"""
from __future__ import annotations

import json
import operator

from engine import envs
import os

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def check(*items: tuple[str, float, str, float]) -> None:
    """Assert each (name, value, op, limit), e.g. ("icl ATE m", 0.008, "<", 0.01). All items are
    recorded first, so a failing one does not hide the values of the others; the assertion names
    every item that fails."""
    log = envs.get("RECONSTUDIO_ACCURACY_LOG")
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    if log:
        with open(log, "a") as f:
            for name, value, op, limit in items:
                f.write(json.dumps({"test": test, "name": name, "value": float(value), "op": op,
                                    "limit": float(limit)}) + "\n")
    bad = [f"{name} = {float(value):.6g} (limit {op} {limit:g})" for name, value, op, limit in items
           if not _OPS[op](float(value), limit)]
    assert not bad, "; ".join(bad)
