#!/usr/bin/env python3
"""Tables for scripts/perf-emu.sh: measured time of every algorithm on emulated hosts, the simulator's prediction of
each (chorus-plan with the setup's topology file and the chorus-tune file measured in the same run), the selector's
choice, and the acceptance counts:
  - hierarchical all-reduce against the flat ring;
  - predictions within 30% of the measurement (all algorithms, collectives, sizes);
  - the selector's choice within 15% of the fastest measured algorithm (per collective and size).
Raw files: <raw>/<setup>-<coll>-<algo>.json (perf tool -J output) and <raw>/tune-<setup>.json."""
import argparse
import json
import os
import subprocess

COLLS = ["allreduce", "allgather", "reducescatter"]
NAMES = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter"}


def fmt_size(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def load_measured(path):
    with open(path) as f:
        return {r["size"]: r for r in json.load(f) if not r["inplace"]}


def predict(binary, topo, tune, coll, sizes):
    """{algo: {size: us}} and {size: choice} from chorus-plan's table."""
    cmd = [binary, "--topo", topo, "--coll", coll, "--bytes", f"{min(sizes)}:{max(sizes)}", "--step", "4"]
    if tune:
        cmd += ["--tune", tune]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    names, pred, choice = [], {}, {}
    for line in text.splitlines():
        if line.startswith("#") and "size(B)" in line:
            names = [c.strip() for c in line.split("|")[1:-1]]
            pred = {n: {} for n in names}
        elif line.strip() and not line.startswith("#") and names:
            cols = line.split("|")
            size = int(cols[0].split()[0])
            for name, cell in zip(names, cols[1:-1]):
                parts = cell.split()
                if parts and parts[0] not in ("-", "n/a"):
                    try:
                        pred[name][size] = float(parts[0])
                    except ValueError:
                        pass
            choice[size] = cols[-1].split()[0]
    return pred, choice


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--raw", required=True)
    ap.add_argument("--setups", default="2x2 4x2")
    ap.add_argument("--title", default="Emulated hosts")
    args = ap.parse_args()
    plan = os.path.join(args.bin, "chorus-plan")
    out = [f"# {args.title}", ""]
    out.append("Every algorithm measured side by side in one run of `sudo scripts/perf-emu.sh` (float32 sum, "
               "out of place, mean time over iterations, ranks as processes in network namespaces: shm inside a "
               "host, tcp between hosts, each host's link shaped by tbf to 1 Gbit/s each way). Predictions: "
               "`chorus-plan --topo topologies/emu-HxR.json --tune tune-HxR.json` with the link costs chorus-tune "
               "measured in the same run. busbw as nccl-tests defines it.")
    pred_ok = pred_n = sel_ok = sel_n = chosen_ok = chosen_n = 0
    misses = []
    for setup in args.setups.split():
        tune = os.path.join(args.raw, f"tune-{setup}.json")
        tune = tune if os.path.exists(tune) else ""
        topo = f"topologies/emu-{setup}.json"
        out += ["", f"## {setup.replace('x', ' hosts x ')} ranks", ""]
        for coll in COLLS:
            meas = {}
            for f in sorted(os.listdir(args.raw)):
                pre = f"{setup}-{coll}-"
                if f.startswith(pre) and f.endswith(".json"):
                    meas[f[len(pre):-5]] = load_measured(os.path.join(args.raw, f))
            if not meas:
                continue
            algos = [a for a in meas if a != "auto"]
            sizes = sorted(next(iter(meas.values())).keys())
            pred, choice = predict(plan, topo, tune, coll, sizes)
            out += [f"### {NAMES[coll]}", ""]
            head = "| size | " + " | ".join(f"{a} meas / pred (us)" for a in algos)
            head += " | fastest | selector (pred) | selector / fastest | auto run (us) |"
            out += [head, "|" + "---|" * (len(algos) + 5)]
            for s in sizes:
                row = [fmt_size(s)]
                times = {}
                for a in algos:
                    m = meas[a].get(s)
                    if m is None or m.get("wrong", 0):
                        row.append("wrong" if m else "-")
                        continue
                    t = m["time_us"]
                    times[a] = t
                    p = pred.get(a, {}).get(s)
                    if p is not None:
                        err = (p - t) / t
                        pred_n += 1
                        ok = abs(err) <= 0.30
                        pred_ok += ok
                        if not ok:
                            misses.append(f"{setup} {coll} {a} {fmt_size(s)}: measured {t:.0f} us, "
                                          f"predicted {p:.0f} us ({err:+.0%})")
                        row.append(f"{t:.0f} / {p:.0f} ({err:+.0%})")
                    else:
                        row.append(f"{t:.0f} / -")
                fastest = min(times, key=times.get)
                ch = choice.get(s, "?")
                ratio = times.get(ch, float("nan")) / times[fastest]
                sel_n += 1
                sel_ok += ratio <= 1.15
                if ch in times and s in pred.get(ch, {}):
                    chosen_n += 1
                    chosen_ok += abs(pred[ch][s] - times[ch]) / times[ch] <= 0.30
                auto = meas.get("auto", {}).get(s)
                row += [fastest, ch, f"{ratio:.2f}", f"{auto['time_us']:.0f}" if auto else "-"]
                out.append("| " + " | ".join(row) + " |")
            out.append("")
        ring = os.path.join(args.raw, f"{setup}-allreduce-ring.json")
        hier = os.path.join(args.raw, f"{setup}-allreduce-hier.json")
        if os.path.exists(ring) and os.path.exists(hier):
            r, h = load_measured(ring), load_measured(hier)
            out += ["### hierarchical all-reduce against the flat ring", "",
                    "| size | ring busbw (GB/s) | hier busbw (GB/s) | hier speedup |", "|---|---|---|---|"]
            for s in sorted(r):
                if s in h:
                    out.append(f"| {fmt_size(s)} | {r[s]['busbw']:.3f} | {h[s]['busbw']:.3f} | "
                               f"{r[s]['time_us'] / h[s]['time_us']:.2f}x |")
            out.append("")
    out += ["## Acceptance counts", "",
            f"- Predictions within 30% of the measurement: {pred_ok} of {pred_n} points "
            f"({100.0 * pred_ok / max(pred_n, 1):.0f}%; every algorithm, collective, size and setup).",
            f"- Predictions of the program the selector chooses within 30% of its measurement: {chosen_ok} of "
            f"{chosen_n} points ({100.0 * chosen_ok / max(chosen_n, 1):.0f}%; per setup, collective and size).",
            f"- Selector's choice within 15% of the fastest measured algorithm: {sel_ok} of {sel_n} points "
            f"({100.0 * sel_ok / max(sel_n, 1):.0f}%).", ""]
    if misses:
        out += ["Predictions off by more than 30%:", ""] + [f"- {m}" for m in misses] + [""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
