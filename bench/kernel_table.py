#!/usr/bin/env python3
"""Per-kernel tables for bench/kernel_profile.sh (issue 31): where a training step's GPU time goes.

    kernel_table.py ncu REPORT.csv LABEL [--steps N] [--top K]
    kernel_table.py torch KERNELS.json LABEL [--top K]

ncu: the raw page of an Nsight Compute report (`ncu -i R.ncu-rep --csv --page raw --metrics
gpu__time_duration.sum --print-units base`), one row per kernel launch; --steps N divides the
totals by the steps the report covers. torch: the JSON list bench/torch_gpu_step.py --kernels
writes (torch.profiler's device time per kernel name over one step).

Prints one table per report: kernels grouped by name (template arguments kept, parameters
dropped), launches, total ms, share of the summed kernel time, mean us per launch, and for ncu
the commonest grid and block; then the sum over all kernels and the launch count. The first line
is one JSON object (label, kernel_ms, launches, top rows) for the record.
"""
import csv
import json
import re
import sys
from collections import defaultdict


def base_name(name):
    """A kernel's name without its parameter list: 'void f<T>(float*, int)' -> 'f<T>'."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return name[:i]
    return name


def read_ncu(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints ==PROF== lines around the CSV
    reader = csv.DictReader(lines)
    for r in reader:
        if not r.get("ID", "").strip().isdigit():
            continue  # the units row
        value = r.get("gpu__time_duration.sum", "").replace(",", "")
        try:
            ns = float(value)
        except ValueError:
            continue
        rows.append({"name": base_name(r.get("Kernel Name", "?")), "ns": ns,
                     "grid": r.get("Grid Size", ""), "block": r.get("Block Size", "")})
    return rows


def read_torch(path):
    rows = []
    for k in json.load(open(path)):
        # one entry per kernel name with its count: spread the total over the launches
        n = max(int(k["count"]), 1)
        for _ in range(n):
            rows.append({"name": base_name(k["name"]), "ns": k["total_us"] * 1e3 / n,
                         "grid": "", "block": ""})
    return rows


def table(rows, label, steps, top):
    groups = defaultdict(lambda: {"ns": 0.0, "n": 0, "shapes": defaultdict(int)})
    for r in rows:
        g = groups[r["name"]]
        g["ns"] += r["ns"]
        g["n"] += 1
        if r["grid"]:
            g["shapes"][f'{r["grid"]} x {r["block"]}'] += 1
    total = sum(g["ns"] for g in groups.values())
    order = sorted(groups.items(), key=lambda kv: -kv[1]["ns"])
    record = {"label": label, "kernel_ms_per_step": total / 1e6 / steps,
              "launches_per_step": len(rows) / steps,
              "top": [{"kernel": k, "ms": g["ns"] / 1e6 / steps, "launches": g["n"] / steps}
                      for k, g in order[:top]]}
    print(json.dumps(record))
    print(f"{label}: {total / 1e6 / steps:.2f} ms of kernel time per step over "
          f"{len(rows) / steps:.0f} launches ({len(groups)} kernels)")
    print(f"  {'ms/step':>8} {'share':>6} {'launches':>8} {'us/launch':>9}  kernel [commonest grid x block]")
    for name, g in order[:top]:
        shape = max(g["shapes"].items(), key=lambda kv: kv[1])[0] if g["shapes"] else ""
        short = name if len(name) <= 90 else name[:87] + "..."
        print(f"  {g['ns'] / 1e6 / steps:8.2f} {g['ns'] / total:6.1%} {g['n'] / steps:8.0f} "
              f"{g['ns'] / 1e3 / g['n']:9.1f}  {short}{' [' + shape + ']' if shape else ''}")
    rest = order[top:]
    if rest:
        ns = sum(g["ns"] for _, g in rest)
        print(f"  {ns / 1e6 / steps:8.2f} {ns / total:6.1%} {sum(g['n'] for _, g in rest) / steps:8.0f}"
              f" {'':>9}  ({len(rest)} other kernels)")


def main():
    args = sys.argv[1:]
    steps, top = 1, 25
    if "--steps" in args:
        i = args.index("--steps")
        steps = int(args[i + 1])
        del args[i:i + 2]
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i:i + 2]
    if len(args) != 3 or args[0] not in ("ncu", "torch"):
        sys.exit(__doc__)
    kind, path, label = args
    rows = read_ncu(path) if kind == "ncu" else read_torch(path)
    if not rows:
        sys.exit(f"kernel_table.py: {path}: no kernel rows")
    table(rows, label, steps, top)


if __name__ == "__main__":
    main()
