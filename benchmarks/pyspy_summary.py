"""Summarise a py-spy "raw" (collapsed stacks) recording: per thread, the share of samples and
the functions with the most inclusive samples. Used by benchmarks/h200_end_to_end.sh to see where
the run driver's thread spends its time (record with --threads [--idle] [--gil]).

    python3 benchmarks/pyspy_summary.py run.txt [--top 25] [--match engine/ ...]
"""
from __future__ import annotations

import argparse
import collections
import re

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def parse(path: str):
    """-> {thread: Counter(stack tuple -> samples)}; frames are 'function (file)' without lines."""
    threads: dict = collections.defaultdict(collections.Counter)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or " " not in line:
                continue
            stack, _, n = line.rpartition(" ")
            try:
                count = int(n)
            except ValueError:
                continue
            parts = stack.split(";")
            thread = "?"
            frames = []
            for p in parts:
                if p.startswith("thread ") or p.startswith("process "):
                    if p.startswith("thread "):
                        thread = p
                    continue
                m = _FRAME.match(p)
                if m:
                    file = m.group("file").split("site-packages/")[-1]
                    frames.append(f"{m.group('fn')} ({file.split('/')[-1] if '/' in file else file})"
                                  if "site-packages" not in m.group("file") else f"{m.group('fn')} ({file})")
                else:
                    frames.append(p)
            threads[thread][tuple(frames)] += count
    return threads


def summary(path: str, top: int = 25) -> str:
    threads = parse(path)
    total = sum(sum(c.values()) for c in threads.values())
    out = [f"{path}: {total} samples, {len(threads)} threads"]
    for thread, stacks in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(stacks.values())
        if n < 0.01 * total:
            continue
        incl: collections.Counter = collections.Counter()
        leaf: collections.Counter = collections.Counter()
        for st, c in stacks.items():
            for fr in set(st):
                incl[fr] += c
            if st:
                leaf[st[-1]] += c
        out.append(f"\n== {thread}: {n} samples ({100 * n / total:.1f} %)")
        out.append("  inclusive:")
        out += [f"    {100 * c / n:5.1f} %  {fr}" for fr, c in incl.most_common(top)]
        out.append("  self (leaf):")
        out += [f"    {100 * c / n:5.1f} %  {fr}" for fr, c in leaf.most_common(top // 2)]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)
    for f in a.files:
        print(summary(f, a.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
