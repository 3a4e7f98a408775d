"""Formats one GPU run's TP outputs into the GPU section of the benchmark report
(bench/REPORT_GPU.md, next to the CPU report bench/REPORT.md). tools/bench_report.sh --gpu DIR
calls it; DIR holds what .gpu/run.sh (tools/gpu_bundle.sh) wrote under $OUT:

  machine.txt         key=value lines: date, commit, host, gpu, gpus, driver, cuda, cpu, cores,
                      tokens, d, steps (bench_report.sh --gpu collects them on the GPU machine)
  tp_bench_cuda*.json tp_bench --device=cuda --benchmark_format=json --benchmark_out (one file
                      per run, e.g. one per dtype; a file cut short by a time limit is read up
                      to its last complete row)
  tp_model_gpu.md     tp_model_gpu_report's markdown (GEMM efficiency, validation, multi-node)

    /usr/bin/python3 tools/bench_report_gpu.py --dir=DIR --out_md=DIR/REPORT_GPU.md

Exits 2 with the reason when an input is missing or malformed.
"""
import argparse
import glob
import json
import os
import re
import sys

LAYERS = ["column_parallel_linear", "row_parallel_linear", "mlp", "attention", "block",
          "async_tp_mlp"]
HEADER_KEYS = ["date", "commit", "host", "gpu", "gpus", "driver", "cuda", "cpu", "cores",
               "tokens", "d", "steps"]


def fail(msg):
    sys.stderr.write("bench_report_gpu: %s\n" % msg)
    sys.exit(2)


def parse_name(name):
    """'mlp/tp:2/tokens:4096/d:2048/sp/fwd_bwd/cuda_shared/bf16/iterations:5/manual_time'."""
    parts = name.split("/iterations:")[0].split("/")
    row = {"name": "/".join(parts), "layer": parts[0], "tp": None, "sp": "sp" in parts,
           "mode": "fwd_bwd" if "fwd_bwd" in parts else "fwd", "unsharded": "unsharded" in parts,
           "placement": next((p for p in parts if p.startswith("cuda_")), "?"),
           "dtype": parts[-1] if parts[-1] in ("f32", "bf16") else "?"}
    for p in parts:
        m = re.match(r"tp:(\d+)$", p)
        if m:
            row["tp"] = int(m.group(1))
    return row


def read_machine(path):
    if not os.path.exists(path):
        fail("%s is missing (bench_report.sh --gpu writes it on the GPU machine)" % path)
    machine = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            machine[k] = v
    return machine


def fmt(x, spec="%.3f"):
    return "-" if x is None else spec % x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out_md", required=True)
    args = ap.parse_args()
    d = args.dir
    machine = read_machine(os.path.join(d, "machine.txt"))
    bench_paths = sorted(glob.glob(os.path.join(d, "tp_bench_cuda*.json")))
    if not bench_paths:
        fail("no tp_bench_cuda*.json in %s (tp_bench --device=cuda --benchmark_out writes it)" % d)
    model_path = os.path.join(d, "tp_model_gpu.md")
    benchmarks, cut_short = [], []
    for path in bench_paths:
        text = open(path).read()
        try:
            bench = json.loads(text)
        except ValueError as e:
            # A run stopped by a time limit leaves the rows written so far: close the list.
            cut = text.rstrip().rstrip(",")
            try:
                bench = json.loads(cut + "\n]\n}") if '"benchmarks"' in text else None
            except ValueError:
                bench = None
            if bench is None:
                fail("%s: %s" % (path, e))
            cut_short.append(os.path.basename(path))
        if not isinstance(bench, dict) or "benchmarks" not in bench:
            fail("%s: no \"benchmarks\" list (not Google Benchmark JSON?)" % path)
        benchmarks += bench["benchmarks"]
    bench_path = bench_paths[0]
    model_md = open(model_path).read() if os.path.exists(model_path) else None

    layers, unsharded, gemms, colls, errors = [], {}, [], [], []
    for b in benchmarks:
        name = b["name"].split("/iterations:")[0]
        if b.get("error_occurred"):
            errors.append((name, b.get("error_message", "error")))
            continue
        if name.startswith("gemm/") or name.startswith("collective/") or name.startswith("link/"):
            (gemms if name.startswith("gemm/") else colls).append((name, b))
            continue
        r = parse_name(b["name"])
        if r["layer"] not in LAYERS:
            continue
        unit = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}.get(b.get("time_unit", "ms"), 1.0)
        r["ms"] = b["real_time"] * unit
        for k in ["FLOP/s", "comm_bytes", "comm_ms", "fenced_ms", "cpu_ms", "vs_unsharded"]:
            r[k] = b.get(k)
        if r["unsharded"]:
            unsharded[(r["layer"], r["mode"], r["dtype"])] = r
        else:
            layers.append(r)

    md = ["# Tensor-parallel benchmark report: GPU\n",
          "Written by `bash tools/bench_report.sh --gpu DIR` from one GPU run's outputs (do not "
          "edit by hand). The CPU report (simulated devices) is `bench/REPORT.md`.\n",
          "| machine | |\n|---|---|"]
    for k in HEADER_KEYS:
        md.append("| %s | %s |" % (k, machine.get(k, "?")))
    md.append("")
    if cut_short:
        md.append("**Cut short:** %s stopped at its time limit; the rows it finished are below, "
                  "the others did not run.\n" % ", ".join(cut_short))
    md.append("## How to read it\n")
    md.append("* **Virtual ranks.** With one GPU, the t TP ranks are virtual ranks sharing it "
              "(`DevicePlacement::SharedGpu()`, a CUDA stream each, in-process collectives as "
              "device copies and reductions). A row at TP t runs the whole layer's work on the "
              "one card, split into t ranks' sharded shapes: it measures how those shapes run "
              "(GEMM efficiency per TP degree) and what the sharding itself costs, not a "
              "speedup. `placement` cuda_per_gpu rows (several GPUs) are the real thing "
              "(in-process peer copies, not NCCL).")
    md.append("* `ms`: mean over steps of the longest rank's CUDA-event span of one step (the "
              "streams drained and the ranks at a barrier before each step). `fenced ms`: rank "
              "0's host time for the step between barriers. `vs 1 GPU`: `ms` over the same "
              "layer unsharded on one stream (> 1: the sharded form costs more). `TFLOP/s`: "
              "matmul FLOPs of the whole layer per second. `comm ms`: rank 0's host time inside "
              "collectives (they drain the rank's stream on entry, so queued compute counts).")
    md.append("")
    md.append("## TP layers (//bench:tp_bench --device=cuda)\n")
    groups = {}
    for r in layers:
        groups.setdefault((r["layer"], r["mode"], r["dtype"], r["placement"]), []).append(r)
    order = {l: i for i, l in enumerate(LAYERS)}
    for key in sorted(groups, key=lambda k: (order.get(k[0], 99), k[1], k[2], k[3])):
        layer, mode, dtype, placement = key
        one = unsharded.get((layer, mode, dtype))
        md.append("### %s, %s, %s, %s%s\n" % (
            layer, mode, dtype, placement,
            " (unsharded on one stream: %.3f ms)" % one["ms"] if one else ""))
        md.append("| TP | SP | ms | fenced ms | vs 1 GPU | TFLOP/s | comm ms | comm KiB |")
        md.append("|---|---|---|---|---|---|---|---|")
        for r in sorted(groups[key], key=lambda r: (r["sp"], r["tp"] or 0)):
            md.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["tp"], "yes" if r["sp"] else "no", fmt(r["ms"]), fmt(r["fenced_ms"]),
                fmt(r["vs_unsharded"], "%.2f"),
                fmt(r["FLOP/s"] / 1e12 if r["FLOP/s"] else None, "%.1f"),
                fmt(r["comm_ms"]), fmt(r["comm_bytes"] / 1024 if r["comm_bytes"] else 0, "%.0f")))
        md.append("")
    if not layers:
        md.append("No layer rows in %s.\n" % os.path.basename(bench_path))
    if colls:
        md.append("## Collectives on the GPU (the layers' activation size)\n")
        md.append("| case | us | busbw GB/s |\n|---|---|---|")
        for name, b in colls:
            unit = {"us": 1.0, "ms": 1e3, "ns": 1e-3, "s": 1e6}.get(b.get("time_unit", "us"), 1.0)
            md.append("| %s | %.1f | %s |" % (name, b["real_time"] * unit,
                                              fmt(b.get("busbw_GB/s"), "%.1f")))
        md.append("")
    if errors:
        md.append("## Rows that failed\n")
        md.append("| row | error |\n|---|---|")
        for name, msg in errors:
            md.append("| %s | %s |" % (name, msg.replace("|", "\\|").replace("\n", " ")))
        md.append("")
    if model_md is None:
        md.append("## TP model\n\n`tp_model_gpu.md` is missing from this run's outputs.\n")
    else:
        # The model's own title becomes a section of this report.
        body = re.sub(r"^(#+) ", r"#\1 ", model_md, flags=re.M)
        md.append(body)
    open(args.out_md, "w").write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
