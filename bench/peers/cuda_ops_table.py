#!/usr/bin/env python3
"""Joins //bench:cuda_bench's JSON output with bench/peers/torch_cuda_ops.py's lines into one
markdown table: per case ours and PyTorch's time, ours / PyTorch speed (> 1: we are faster) and,
for the memory-bound ops, each side's fraction of a device copy of the same bytes; for GEMMs
each side's TFLOP/s and ours against our own raw cuBLASLt call.

  python3 bench/peers/cuda_ops_table.py cuda_bench.json torch_cuda_ops.jsonl > table.md
"""
import json
import re
import sys


def base_name(name):
    return re.sub(r"/(iterations:\d+|manual_time|min_time:[0-9.]+s?|repeats:\d+|real_time)", "",
                  name)


def load_ours(path):
    with open(path) as f:
        data = json.load(f)
    ours = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        ours[base_name(b["name"])] = dict(b, ms=b["real_time"] * unit)
    return ours, data.get("context", {})


def load_torch(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                out[r["name"]] = r
    return out


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ours, ctx = load_ours(argv[1])
    torch = load_torch(argv[2])
    print(f"GPU ops, ours vs PyTorch on the same card ({ctx.get('date', '?')}; "
          f"cuda_bench + bench/peers/torch_cuda_ops.py)\n")
    print("| case | ours ms | PyTorch ms | ours / PyTorch speed | ours: copy frac | "
          "PyTorch: copy frac |")
    print("|---|---|---|---|---|---|")
    for name in sorted(n for n in set(ours) | set(torch) if n.startswith("ops/")):
        o, t = ours.get(name), torch.get(name)
        o_ms = o["ms"] if o else None
        t_ms = t.get("ms") if t else None
        speed = t_ms / o_ms if o_ms and t_ms else None
        o_frac = o.get("copy_frac") if o else None
        t_frac = t["copy_ms"] / t_ms if t and t_ms and t.get("copy_ms") else None
        note = f" ({t['error']})" if t and "error" in t else ""
        print(f"| {name[4:]}{note} | {fmt(o_ms)} | {fmt(t_ms)} | {fmt(speed)} | {fmt(o_frac)} | "
              f"{fmt(t_frac)} |")
    print("\n| GEMM | ours TFLOP/s | PyTorch TFLOP/s | ours / PyTorch | ours / raw cuBLASLt |")
    print("|---|---|---|---|---|")
    for name in sorted(n for n in set(ours) | set(torch) if n.startswith("gemm/")):
        o, t = ours.get(name), torch.get(name)
        o_tf = o.get("TFLOPs") if o else None
        t_tf = t["flops"] / (t["ms"] * 1e-3) / 1e12 if t and t.get("ms") else None
        speed = o_tf / t_tf if o_tf and t_tf else None
        raw = o.get("ratio") if o else None
        print(f"| {name[5:]} | {fmt(o_tf)} | {fmt(t_tf)} | {fmt(speed)} | {fmt(raw)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
