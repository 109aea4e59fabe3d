#!/usr/bin/env python3
"""Merges perf-tool JSON files (chorus-shm-N.json, chorus-tcp-N.json, mpi-vader-N.json, mpi-tcp-N.json,
gloo-tcp-N.json) into markdown tables: one per rank count, out-of-place time and busbw per size, with the
Chorus/Open MPI and Chorus/Gloo ratios."""
import argparse
import glob
import json
import os
import re


def load(path):
    with open(path) as f:
        return {r["size"]: r for r in json.load(f) if not r["inplace"]}


def fmt_size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--title", default="All-reduce")
    ap.add_argument("dir")
    args = ap.parse_args()
    runs = {}
    for path in glob.glob(os.path.join(args.dir, "*.json")):
        m = re.match(r"(chorus|mpi|gloo)-(\w+)-(\d+)\.json", os.path.basename(path))
        if m:
            runs[(m.group(1), m.group(2), int(m.group(3)))] = load(path)
    print(f"# {args.title}\n")
    print("Out-of-place float sum; time in microseconds, busbw in GB/s (nccl-tests factor 2(n-1)/n).")
    print("`x` = Chorus busbw / Open MPI busbw on the same kind of link (shm vs vader, tcp vs tcp); `x gloo` = Chorus")
    print("tcp busbw / Gloo busbw (Gloo has no shared-memory transport).\n")
    for n in sorted({k[2] for k in runs}):
        cols = [("chorus", "shm"), ("mpi", "vader"), ("chorus", "tcp"), ("mpi", "tcp"), ("gloo", "tcp")]
        have = [c for c in cols if (c[0], c[1], n) in runs]
        print(f"## {n} ranks\n")
        ratios = [("x shm", ("chorus", "shm"), ("mpi", "vader")), ("x tcp", ("chorus", "tcp"), ("mpi", "tcp")),
                  ("x gloo", ("chorus", "tcp"), ("gloo", "tcp"))]
        ratios = [r for r in ratios if r[1] in have and r[2] in have]
        head = "| size |" + "".join(f" {a} {b} us | {a} {b} GB/s |" for a, b in have)
        head += "".join(f" {name} |" for name, _, _ in ratios)
        print(head)
        print("|" + "---|" * (1 + 2 * len(have) + len(ratios)))
        sizes = sorted(set().union(*[runs[(a, b, n)].keys() for a, b in have]))
        for s in sizes:
            row = [fmt_size(s)]
            bw = {}
            for a, b in have:
                r = runs[(a, b, n)].get(s)
                if r is None:
                    row += ["", ""]
                    continue
                bw[(a, b)] = r["busbw"]
                wrong = "" if not r.get("wrong") else f" ({r['wrong']} wrong)"
                row += [f"{r['time_us']:.1f}", f"{r['busbw']:.2f}{wrong}"]
            for _, c, m in ratios:
                row.append(f"{bw[c] / bw[m]:.2f}" if c in bw and m in bw and bw[m] > 0 else "")
            print("| " + " | ".join(row) + " |")
        print()


if __name__ == "__main__":
    main()
