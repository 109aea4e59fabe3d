#!/usr/bin/env python3
"""Merges perf-tool JSON files NAME.json (one per transport, same run) into one markdown table: out-of-place time
and busbw per size for each transport, side by side, with each column's busbw relative to the first."""
import argparse
import os

from perf_table import fmt_size, load  # the same JSON records and size labels as the Open MPI comparison


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--title", default="All-reduce per transport")
    ap.add_argument("--note", action="append", default=[], help="a line to print under the title (repeatable)")
    ap.add_argument("dir")
    ap.add_argument("names", nargs="+", help="NAME.json files in dir, in column order; the first is the reference")
    args = ap.parse_args()
    runs = {n: load(os.path.join(args.dir, n + ".json")) for n in args.names}
    ranks = {r.get("nranks") for run in runs.values() for r in run.values()} - {None}
    print(f"# {args.title}\n")
    print("Out-of-place float sum, processes under chorusrun; time in microseconds, busbw in GB/s (nccl-tests "
          "factor 2(n-1)/n). All columns come from one run, one after another on the same machine.")
    print(f"`/{args.names[0]}` = that column's busbw over {args.names[0]}'s.\n")
    for note in args.note:
        print(f"{note}\n")
    if ranks:
        print(f"Ranks: {', '.join(str(r) for r in sorted(ranks))}\n")
    head = "| size |" + "".join(f" {n} us | {n} GB/s |" for n in args.names)
    head += "".join(f" {n} /{args.names[0]} |" for n in args.names[1:])
    print(head)
    print("|" + "---|" * (1 + 2 * len(args.names) + len(args.names) - 1))
    sizes = sorted(set().union(*[r.keys() for r in runs.values()]))
    for s in sizes:
        row = [fmt_size(s)]
        bw = {}
        for n in args.names:
            r = runs[n].get(s)
            if r is None:
                row += ["", ""]
                continue
            bw[n] = r["busbw"]
            wrong = "" if not r.get("wrong") else f" ({r['wrong']} wrong)"
            row += [f"{r['time_us']:.1f}", f"{r['busbw']:.2f}{wrong}"]
        ref = bw.get(args.names[0], 0)
        for n in args.names[1:]:
            row.append(f"{bw[n] / ref:.2f}" if n in bw and ref > 0 else "")
        print("| " + " | ".join(row) + " |")
    print()


if __name__ == "__main__":
    main()
