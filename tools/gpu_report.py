"""Pieces of the GPU run's report (tools/gpu_run.sh), from the logs its sections write.

  python3 tools/gpu_report.py train-row TRAIN_LOG PEER_JSONL [--layers=12 --d_model=768 ...]
      markdown rows: train_gpt --device=cuda (median tokens/s of the steps after the first two,
      MFU, peak GPU memory) next to the PyTorch peer's modes (bench/peers/gpt_torch_cuda.py)
  python3 tools/gpu_report.py determinism LOG_A LOG_B
      whether two runs printed the same "step N loss X" lines, bitwise (exit 1 if not), and their
      median tokens/s after step 0 (the cost of --deterministic, next to the default runs')
  python3 tools/gpu_report.py attention OURS_JSON TORCH_JSONL
      attention_bench's BM_CudaKernelTcBf16 rows against PyTorch SDPA (flash), TFLOP/s and the
      ratio, flagged under 0.7x
  python3 tools/gpu_report.py skipped LOG...
      "- binary: Test.Case: reason" for each gtest case a log says was skipped
  python3 tools/gpu_report.py overlap JSON...
      tests/gpu_nccl_overlap_check's results (one JSON per launch): whether the communication
      stream overlapped compute, the host waits per step against the expected count (the loss
      read alone: any other kind is named), and the step time with --overlap on vs off; exit 1
      unless one passed

MFU counts as the PyTorch peer does: (6 N + 12 L d T) tokens/s over the card's dense bf16 peak
(N: every parameter, wte once), given with --peak_tflops (default: the H100/H200's 989.4).
"""
import argparse
import json
import os
import re
import statistics
import sys

STEP = re.compile(r"^step (\d+) loss (\S+) \|.*\| ([0-9.]+) ms/step \| ([0-9.]+) tokens/s")
PEAK = re.compile(r"^GPU: peak memory (\S+ \S+)")


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def gpt_params(layers, d, vocab, seq):
    per_layer = 12 * d * d + 13 * d  # qkv, proj, 2 MLP matrices, biases, 2 LayerNorms
    return vocab * d + seq * d + layers * per_layer + 2 * d


def parse_train(text):
    steps, peak = [], None
    for line in text.splitlines():
        m = STEP.match(line)
        if m:
            steps.append((int(m.group(1)), m.group(2), float(m.group(3)), float(m.group(4))))
        p = PEAK.match(line)
        if p:
            peak = p.group(1)
    return steps, peak


def loss_lines(text):
    return [(s, loss) for s, loss, _, _ in parse_train(text)[0]]


def train_row(text, a):
    steps, peak = parse_train(text)
    timed = [tps for s, _, _, tps in steps if s >= 2] or [tps for _, _, _, tps in steps]
    if not timed:
        return "| shardmap train_gpt | no step finished (see train_gpt.log) | | |"
    tps = statistics.median(timed)
    n = gpt_params(a.layers, a.d_model, a.vocab, a.seq)
    flops_per_token = 6 * n + 12 * a.layers * a.d_model * a.seq
    mfu = flops_per_token * tps / (a.peak_tflops * 1e12)
    return f"| shardmap train_gpt | {tps:,.0f} | {100 * mfu:.1f}% | {peak or '?'} |"


def peer_rows(jsonl):
    rows = []
    if not os.path.exists(jsonl):
        return rows
    for line in read(jsonl).splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        mfu = r.get("mfu")
        peak = r.get("peak_bytes")
        rows.append(f"| PyTorch {r.get('mode', '?')} | {r.get('tokens_per_s', 0):,.0f} | "
                    f"{'?' if mfu is None else f'{100 * mfu:.1f}%'} | "
                    f"{'?' if peak is None else f'{peak / 2**30:.2f} GiB'} |")
    return rows


def attention_table(ours_json, torch_jsonl):
    ours = {}
    if os.path.exists(ours_json):
        try:
            data = json.loads(read(ours_json))
        except ValueError:
            data = {"benchmarks": []}
        for b in data.get("benchmarks", []):
            m = re.match(r"BM_CudaKernel(Tc|Simt)Bf16/(\d+)/(\d+)/(\d+)/(\d+)", b.get("name", ""))
            if m and "TFLOP/s" in b:
                key = tuple(int(x) for x in m.group(2, 3, 4, 5))
                ours.setdefault(key, {})[m.group(1)] = b["TFLOP/s"]
    theirs = {}
    if os.path.exists(torch_jsonl):
        for line in read(torch_jsonl).splitlines():
            if line.strip().startswith("{"):
                r = json.loads(line)
                theirs[(r["batch"], r["seq"], r["heads"], r["head_dim"])] = r
    out = ["| shape (b, t, h, d) | tensor cores TFLOP/s | SIMT TFLOP/s | PyTorch SDPA TFLOP/s "
           "(backend) | tensor cores / SDPA |", "|---|---|---|---|---|"]
    for key in sorted(set(ours) | set(theirs)):
        o, t = ours.get(key, {}), theirs.get(key)
        tc = o.get("Tc")
        ratio = "?"
        if tc is not None and t is not None and t["tflops"] > 0:
            r = tc / t["tflops"]
            ratio = f"{r:.2f}x" + (" (below 0.7x: restructure, issue 36 item 9)" if r < 0.7 else "")
        fmt = lambda v: "?" if v is None else f"{v:.1f}"
        peer = "?" if t is None else "%.1f (%s)" % (t["tflops"], t["backend"])
        out.append(f"| {key} | {fmt(tc)} | {fmt(o.get('Simt'))} | {peer} | {ratio} |")
    return "\n".join(out)


def skipped(paths):
    out = []
    for path in paths:
        msg = ""
        lines = read(path).splitlines()
        for i, line in enumerate(lines):
            if line.endswith(": Skipped"):
                msg = lines[i + 1].strip() if i + 1 < len(lines) else ""
            m = re.match(r"^\[  SKIPPED \] (\S+) \(", line)
            if m:
                name = re.sub(r"\.log$", "", os.path.basename(path))
                out.append(f"- {name}: {m.group(1)}: {msg or 'no reason given'}")
                msg = ""
    return out


def waits_text(w):
    kinds = w.get("by_kind", {})
    return ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "none"


def overlap_lines(path):
    """Markdown lines for one gpu_nccl_overlap_check JSON, and whether it passed."""
    if not os.path.exists(path):
        log = re.sub(r"\.json$", ".log", path)
        said = ""
        if log != path and os.path.exists(log):
            lines = [l for l in read(log).splitlines()
                     if re.search(r"gpu_nccl_overlap_check|error|failed", l, re.I)]
            said = f": {lines[0].strip()[:300]}" if lines else ""
        return [f"- {os.path.basename(path)}: no result (the check did not finish{said}; "
                f"see {os.path.basename(log)})"], False
    try:
        r = json.loads(read(path))
    except ValueError as e:
        return [f"- {os.path.basename(path)}: unreadable ({e})"], False
    g = r.get("gpt", {})
    verdict = "PASS" if r.get("pass") else "FAIL: " + (r.get("why") or "?").rstrip("; ")
    out = [f"- {r.get('world', '?')} rank(s): **{verdict}**"]
    ratio = g.get("ratio_on_off", 0)
    out.append(f"  - GPT ({g.get('config', '?')}): {g.get('overlap_ms', 0):.3f} ms of "
               f"{g.get('comm_ms', 0):.3f} ms of started collectives overlapped compute after "
               f"step 0; step {g.get('step_s_on', 0):.4f} s with --overlap on, "
               f"{g.get('step_s_off', 0):.4f} s off (on/off {ratio:.3f})")
    for mode in ("on", "off"):
        steps = g.get(mode, [])
        waits = "; ".join(f"{s['host_waits']['total']} ({waits_text(s['host_waits'])}) vs "
                          f"{s['expected_host_waits']}" for s in steps)
        out.append(f"  - host waits per step, overlap {mode} (measured vs expected): {waits}")
    # The goal: the loss read alone. Any other kind of wait after step 0 is named.
    other = []
    for mode in ("on", "off"):
        for s in g.get(mode, [])[1:]:
            kinds = {k: v for k, v in s["host_waits"].get("by_kind", {}).items()
                     if k != "d2h_read"}
            if kinds:
                other.append(f"{mode} step {s['step']}: " +
                             ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    if other:
        out.append("  - host waits other than the loss read (each fails the check): " +
                   "; ".join(other))
    left = {}
    for s in g.get("on", [])[1:]:
        for op in s.get("blocking_collectives", []):
            left[op] = left.get(op, 0) + 1
    if left:
        n = max(1, len(g.get("on", [])) - 1)
        out.append("  - blocking collectives in an overlapped step (stream-ordered: enqueued and "
                   "watched, no host wait): " +
                   ", ".join(f"{op} x{c / n:g}" for op, c in sorted(left.items())))
    for rep in r.get("streams", []):
        out.append(f"  - streams rep {rep['rep']}: a started all-reduce of "
                   f"{rep['comm_ms']:.3f} ms beside {rep['compute_ms']:.3f} ms of matmuls, "
                   f"{rep['overlap_ms']:.3f} ms overlapped, host waits "
                   f"{waits_text(rep['host_waits'])}")
    return out, bool(r.get("pass"))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["train-row", "determinism", "attention", "skipped",
                                    "overlap"])
    p.add_argument("files", nargs="*")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d_model", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--peak_tflops", type=float, default=989.4)
    a = p.parse_args(argv)
    if a.what == "train-row":
        print("| run | tokens/s | MFU | peak memory |\n|---|---|---|---|")
        print(train_row(read(a.files[0]), a))
        for r in peer_rows(a.files[1] if len(a.files) > 1 else ""):
            print(r)
        return 0
    if a.what == "determinism":
        texts = [read(f) for f in a.files[:2]]
        x, y = (loss_lines(t) for t in texts)
        rates = []
        for t in texts:
            r = [tps for s, _, _, tps in parse_train(t)[0] if s >= 1]
            rates.append(f"{statistics.median(r):,.0f}" if r else "?")
        speed = f" (median tokens/s after step 0: {rates[0]} and {rates[1]})"
        if not x or not y:
            print(f"no loss lines ({len(x)} and {len(y)} steps): see the logs")
            return 1
        if x == y:
            print(f"bitwise equal: {len(x)} steps, last loss {x[-1][1]}{speed}")
            return 0
        first = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
        print(f"DIFFER from step {first}: {x[first:first + 1]} vs {y[first:first + 1]}{speed}")
        return 1
    if a.what == "attention":
        print(attention_table(a.files[0], a.files[1]))
        return 0
    if a.what == "overlap":
        passed = False
        for f in a.files:
            lines, ok = overlap_lines(f)
            print("\n".join(lines))
            passed = passed or ok
        return 0 if passed else 1
    print("\n".join(skipped(a.files)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
