"""Formats tools/bench_report.sh's measurements into bench/REPORT.md and bench/report.json, and
prints a gnuplot script for bench/tp_scaling.png (time per step vs TP degree, per layer).

    /usr/bin/python3 tools/bench_report.py --dir=TMP --out_md=bench/REPORT.md \
        --out_json=bench/report.json --plot_data=TMP/plot.dat > TMP/plot.gp
"""
import argparse
import json
import os
import re

LAYERS = ["column_parallel_linear", "row_parallel_linear", "mlp", "attention", "block"]


def parse_name(name):
    """'mlp/tp:2/tokens:512/d:512/sp/fwd_bwd/iterations:3/manual_time' -> dict."""
    parts = name.split("/")
    row = {"layer": parts[0], "tp": None, "sp": "sp" in parts,
           "mode": "fwd_bwd" if "fwd_bwd" in parts else "fwd"}
    for p in parts:
        m = re.match(r"tp:(\d+)$", p)
        if m:
            row["tp"] = int(m.group(1))
    row["unsharded"] = "unsharded" in parts
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out_md", required=True)
    ap.add_argument("--out_json", required=True)
    ap.add_argument("--plot_data", required=True)
    args = ap.parse_args()
    d = args.dir
    machine = dict(l.strip().split("=", 1) for l in open(os.path.join(d, "machine.txt")) if "=" in l)
    bench = json.load(open(os.path.join(d, "tp_bench.json")))
    model = json.load(open(os.path.join(d, "tp_model.json")))
    peer = json.load(open(os.path.join(d, "peer.json")))
    model_md = open(os.path.join(d, "tp_model.md")).read()
    peer_md = open(os.path.join(d, "peer.md")).read()

    rows, unsharded = [], {}
    for b in bench["benchmarks"]:
        r = parse_name(b["name"])
        r["name"] = b["name"].split("/iterations:")[0]
        if b.get("error_occurred"):
            r["error"] = b.get("error_message", "error")
            rows.append(r)
            continue
        r["ms"] = b["real_time"]
        for k in ["FLOP/s", "comm_bytes", "comm_ms", "compute_ms", "cpu_ms", "vs_unsharded"]:
            if k in b:
                r[k] = b[k]
        if r["unsharded"]:
            unsharded[(r["layer"], r["mode"])] = r
        else:
            rows.append(r)

    md = []
    md.append("# Tensor-parallel benchmark report\n")
    md.append("Written by `bash tools/bench_report.sh` (do not edit by hand; rerun it). Numbers "
              "are from one run on the machine below.\n")
    md.append("| machine | |\n|---|---|")
    for k in ["date", "commit", "cpu", "cores", "memory", "kernel", "load_start", "load_end", "tokens", "d", "steps"]:
        md.append("| %s | %s |" % (k, machine.get(k, "?")))
    md.append("")
    # Targets at a glance (issue 13), computed from this run's numbers.
    summ = next((m for m in model if m.get("kind") == "validation_summary"), None)
    md.append("## Targets at a glance (this run)\n")
    md.append("| target | measured | met |\n|---|---|---|")
    if summ:
        md.append("| model prediction error <= 20%% (CPU time) | median %.0f%%, %d of %d rows within 20%% | %s |" % (
            100 * summ["cpu_median_abs_err"], summ["cpu_within_20pct"], summ["rows"],
            "yes" if summ["cpu_within_20pct"] == summ["rows"] else "no"))
        md.append("| model prediction error <= 20%% (wall time, loaded machine) | median %.0f%%, %d of %d rows within 20%% | %s |" % (
            100 * summ["wall_median_abs_err"], summ["wall_within_20pct"], summ["rows"],
            "yes" if summ["wall_within_20pct"] == summ["rows"] else "no"))
    for r in peer.get("tp_mlp", []):
        need = 1.4 if r["tp"] == 2 else 1.0
        md.append("| TP MLP faster than PyTorch+Gloo at TP %d (>= %.1fx) | wall %.2fx (best rounds), %.2fx (medians); CPU per rank %.2fx | wall %s, CPU %s |" % (
            r["tp"], need, r["torch_over_ours_best"], r["torch_over_ours_median"], r["torch_over_ours_cpu"],
            "yes" if r["torch_over_ours_best"] >= need else "no", "yes" if r["torch_over_ours_cpu"] >= need else "no"))
    for r in peer.get("per_op", []):
        md.append("| per-op time >= 10x smaller: %s | %.1fx | %s |" % (
            r["row"], r["torch_over_ours"], "yes" if r["torch_over_ours"] >= 10 else "no"))
    md.append("")
    md.append("""## How to read it

* **Simulated devices.** Every TP rank is a thread of one process on this CPU (in-process
  collectives, one BLAS thread per rank, f32). With more ranks than idle cores, ranks share cores:
  the compute of TP t cannot run faster than the core count allows, and collectives include the
  time a rank waits for a descheduled peer. The load average above says how busy the machine was
  (other jobs ran beside this one). Read the **ratios within this run**, not the absolute times.
* `ms`: mean wall time of one step on rank 0 (fenced by barriers). `vs 1 dev`: that time over the
  same layer unsharded on one device in this run (< 1: TP was faster). `comm %`: share of the
  step rank 0 spent inside collectives. `comm KiB`: bytes rank 0 passed to collectives per step
  (an all_gather counts its block, reduce_scatter / all_reduce the whole buffer). `GFLOP/s`:
  matmul FLOPs of the whole layer per second of step time. `CPU ms`: mean rank thread CPU time
  per step; it falls as 1/t when the work is split well, whatever the machine's load.
* The plot `tp_scaling.png` shows the fwd+bwd step time against TP degree per layer, with and
  without sequence parallelism (dashed: the unsharded layer on one device).
* The model section predicts the measured rows from GEMM and collective measurements taken in the
  same run, then applies the same model to H100 figures (assumptions printed next to each table).
""")
    md.append("## TP layers (//bench:tp_bench)\n")
    for layer in LAYERS:
        for mode in ["fwd", "fwd_bwd"]:
            one = unsharded.get((layer, mode))
            md.append("### %s, %s%s\n" % (layer, mode.replace("_", "+"),
                      " (unsharded on one device: %.2f ms, CPU %.2f ms)" % (one["ms"], one["cpu_ms"]) if one else ""))
            md.append("| TP | SP | ms | vs 1 dev | comm % | comm KiB | GFLOP/s | CPU ms |\n|---|---|---|---|---|---|---|---|")
            for r in rows:
                if r["layer"] != layer or r["mode"] != mode:
                    continue
                if "error" in r:
                    md.append("| %s | %s | failed: %s |||||" % (r["tp"], "yes" if r["sp"] else "no", r["error"][:120]))
                    continue
                md.append("| %d | %s | %.2f | %.2f | %.0f%% | %.0f | %.1f | %.2f |" % (
                    r["tp"], "yes" if r["sp"] else "no", r["ms"], r.get("vs_unsharded", float("nan")),
                    100 * r["comm_ms"] / r["ms"], r["comm_bytes"] / 1024, r["FLOP/s"] / 1e9, r["cpu_ms"]))
            md.append("")
    md.append("## TP scaling model (//bench:tp_model_report)\n")
    md.append(model_md.replace("\n## ", "\n### ").replace("\n### ", "\n### ", 1))
    md.append("## Peer: PyTorch eager + Gloo (bench/peers/tp_mlp_torch.sh)\n")
    md.append("PyTorch %s (Debian python3-torch), one process and one intra-op thread per rank, "
              "Megatron's f/g autograd functions over torch.distributed Gloo; ours is "
              "//bench:tp_bench's mlp/tp:T/.../fwd_bwd row, run alternately with it; per-op rows "
              "from //bench:overhead_bench (CPU time). Targets: "
              "ours faster at every TP (>= 1.4x at TP 2); per-op time >= 10x smaller.\n" % peer.get("torch_version"))
    md.append(peer_md)
    md.append("\n## Plot\n\n![fwd+bwd step time vs TP degree](tp_scaling.png)\n")
    open(args.out_md, "w").write("\n".join(md) + "\n")

    report = {"machine": machine, "tp_bench": rows, "unsharded": list(unsharded.values()),
              "tp_model": model, "peer": peer}
    with open(args.out_json, "w") as f:
        json.dump(report, f, indent=1)

    # Plot data: one block per (layer, sp) series of fwd+bwd rows, then the unsharded lines.
    series = []
    with open(args.plot_data, "w") as f:
        for layer in LAYERS:
            for sp in [False, True]:
                pts = sorted((r["tp"], r["ms"]) for r in rows if r["layer"] == layer and
                             r["mode"] == "fwd_bwd" and r["sp"] == sp and "ms" in r)
                if not pts:
                    continue
                f.write("# %s sp=%s\n" % (layer, sp))
                for tp, ms in pts:
                    f.write("%d %.4f\n" % (tp, ms))
                f.write("\n\n")
                series.append("%s%s" % (layer, " (SP)" if sp else ""))
    out_png = os.path.join(os.path.dirname(args.out_md), "tp_scaling.png")
    print("set terminal png size 1200,800 noenhanced")
    print('set output "%s"' % out_png)
    print('set multiplot layout 2,3 title "fwd+bwd step time vs TP degree: tokens %s, d %s, '
          'simulated CPU devices (%s cores, load %s)"' % (
              machine.get("tokens", "?"), machine.get("d", "?"), machine.get("cores", "?"),
              machine.get("load_start", "?")))
    print("set logscale x 2; set logscale y; set xrange [0.8:10]; set xtics (1, 2, 4, 8)")
    print('set xlabel "TP degree"; set ylabel "ms per step"; set grid; set key top right')
    for layer in LAYERS:
        plots = []
        for i, name in enumerate(series):
            if name.split(" ")[0] == layer:
                plots.append('"%s" index %d using 1:2 with linespoints lw 2 title "%s"' % (
                    args.plot_data, i, "SP" if "(SP)" in name else "no SP"))
        one = unsharded.get((layer, "fwd_bwd"))
        if one:
            plots.append('%.4f with lines lc rgb "gray" lw 2 title "1 device, unsharded"' % one["ms"])
        if plots:
            print('set title "%s"' % layer)
            print("plot " + ", \\\n  ".join(plots))
    print("unset multiplot")

if __name__ == "__main__":
    main()
