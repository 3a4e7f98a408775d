"""The TP MLP of //bench:tp_bench (tokens 512, hidden 512, ffn 2048, f32, forward + backward,
no sequence parallelism) written Megatron-style in PyTorch eager with torch.distributed over Gloo,
one process and one intra-op thread per rank; and PyTorch eager's per-op time on 1-element
tensors, the peer of //bench:overhead_bench's add/matmul rows.

    /usr/bin/python3 bench/peers/tp_mlp_torch.py --tp_bench=bazel-bin/bench/tp_bench \
        [--tp=1,2,4] [--steps=10] [--rounds=3] [--ours_overhead=overhead_bench.json] [--json=OUT]

Use bench/peers/tp_mlp_torch.sh, which installs Debian's python3-torch if missing, builds ours
and runs this, printing both side by side (ratio torch / ours: > 1 means we are faster). Timing
matches tp_bench: each step is fenced by barriers and timed on rank 0 (wall); a run's time is
the mean over its measured steps. The machine may be shared, so ours (the tp_bench row, run as a
subprocess) and PyTorch alternate, `--rounds` times per TP degree, and the table gives the
fastest round of each (the least disturbed) and the median.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

TOKENS, HIDDEN, FFN = 512, 512, 2048


class _CopyToTp(torch.autograd.Function):
    """Megatron's f: identity forward, all_reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _ReduceFromTp(torch.autograd.Function):
    """Megatron's g: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def _rank_main(rank, tp, port, steps, warmup, out):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    g = torch.Generator().manual_seed(0)
    # The whole parameters (same on every rank), then this rank's Megatron shards.
    x = torch.randn(TOKENS, HIDDEN, generator=g) * 0.02
    w1 = torch.randn(HIDDEN, FFN, generator=g) * 0.02
    b1 = torch.randn(FFN, generator=g) * 0.02
    w2 = torch.randn(FFN, HIDDEN, generator=g) * 0.02
    b2 = torch.randn(HIDDEN, generator=g) * 0.02
    cols = slice(rank * FFN // tp, (rank + 1) * FFN // tp)
    params = [x, w1[:, cols].contiguous(), b1[cols].contiguous(), w2[cols, :].contiguous(), b2]
    for p in params:
        p.requires_grad_(True)
    xs, w1s, b1s, w2s, b2s = params

    def step():
        for p in params:
            p.grad = None
        h = F.gelu(_CopyToTp.apply(xs) @ w1s + b1s, approximate="tanh")
        y = _ReduceFromTp.apply(h @ w2s) + b2s
        (y * y).sum().backward()

    times, cpus = [], []
    for i in range(warmup + steps):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        c1 = time.process_time()  # the process: its Gloo threads included
        dist.barrier()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            cpus.append(c1 - c0)
    out.put((rank, times, cpus))
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_tp(tp, steps, warmup=2):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, tp, port, steps, warmup, q)) for r in range(tp)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=600) for _ in range(tp))
    times = got[0][1]
    cpu = statistics.mean(statistics.mean(g[2]) for g in got)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError("rank process failed with exit code %s" % p.exitcode)
    return times, cpu


def per_op_ns(fn, min_time=0.3):
    """Median thread CPU ns per call of fn over batches of 1000 calls."""
    for _ in range(1000):
        fn()
    samples, spent = [], 0.0
    while spent < min_time or len(samples) < 5:
        t0 = time.thread_time()
        for _ in range(1000):
            fn()
        dt = time.thread_time() - t0
        samples.append(dt / 1000 * 1e9)
        spent += dt
    return statistics.median(samples)


def overhead_rows():
    """(our overhead_bench row, torch ns per call): 1-element add and 4x4 matmul, without and
    with autograd recording (ours: mode:checked and mode:taped_checked)."""
    torch.set_num_threads(1)
    a, b = torch.ones(1), torch.full((1,), 2.0)
    m, n = torch.randn(4, 4), torch.randn(4, 4)
    ag, mg = a.clone().requires_grad_(True), m.clone().requires_grad_(True)
    return [
        ("add/mode:checked/shape:1", per_op_ns(lambda: a + b)),
        ("add/mode:taped_checked/shape:1", per_op_ns(lambda: ag + b)),
        ("matmul/mode:checked/shape:4x4", per_op_ns(lambda: m @ n)),
        ("matmul/mode:taped_checked/shape:4x4", per_op_ns(lambda: mg @ n)),
    ]


def run_ours(tp_bench, tp, steps):
    """(mean step ms, mean rank CPU ms) of tp_bench's mlp/tp:{tp}/tokens:512/d:512/fwd_bwd row."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([tp_bench, "--steps=%d" % steps, "--warmup=2",
                        "--benchmark_filter=^mlp/tp:%d/tokens:512/d:512/fwd_bwd/" % tp,
                        "--benchmark_format=json", "--benchmark_out=" + out.name],
                       check=True, stdout=subprocess.DEVNULL)
        rows = json.load(open(out.name))["benchmarks"]
    if len(rows) != 1 or rows[0].get("error_occurred"):
        raise RuntimeError("tp_bench gave no mlp/tp:%d fwd_bwd row: %s" % (tp, rows))
    return rows[0]["real_time"], rows[0]["cpu_ms"]


def load_bench(path):
    if not path:
        return {}
    with open(path) as f:
        return {b["name"]: b for b in json.load(f)["benchmarks"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tp_bench", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ours_overhead", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    ours_oh = load_bench(args.ours_overhead)
    result = {"torch_version": torch.__version__, "tp_mlp": [], "per_op": []}

    print("### TP MLP fwd+bwd (tokens 512, hidden 512, ffn 2048, f32, no SP): PyTorch + Gloo vs ours\n")
    print("%d alternating rounds per TP degree, %d measured steps each.\n" % (args.rounds, args.steps))
    print("| TP | PyTorch+Gloo ms (best / median) | ours ms (best / median) | torch / ours (best) | "
          "torch / ours (median) | CPU ms per rank torch / ours | CPU ratio |\n"
          "|---|---|---|---|---|---|---|")
    for tp in [int(t) for t in args.tp.split(",")]:
        torch_ms, ours_ms, torch_cpu, ours_cpu = [], [], [], []
        for _ in range(args.rounds):
            ms, cpu = run_ours(args.tp_bench, tp, args.steps)
            ours_ms.append(ms)
            ours_cpu.append(cpu)
            times, cpu = run_tp(tp, args.steps)
            torch_ms.append(1e3 * statistics.mean(times))
            torch_cpu.append(1e3 * cpu)
        tb, tm = min(torch_ms), statistics.median(torch_ms)
        ob, om = min(ours_ms), statistics.median(ours_ms)
        tc, oc = statistics.median(torch_cpu), statistics.median(ours_cpu)
        print("| %d | %.2f / %.2f | %.2f / %.2f | %.2fx | %.2fx | %.2f / %.2f | %.2fx |" % (
            tp, tb, tm, ob, om, tb / ob, tm / om, tc, oc, tc / oc))
        result["tp_mlp"].append({"tp": tp, "torch_ms": torch_ms, "ours_ms": ours_ms,
                                 "torch_cpu_ms": torch_cpu, "ours_cpu_ms": ours_cpu,
                                 "torch_over_ours_best": tb / ob,
                                 "torch_over_ours_median": tm / om,
                                 "torch_over_ours_cpu": tc / oc})
    print("\nCPU ms per rank: median over rounds of the mean per-step CPU time of a rank (ours: "
          "the rank thread; PyTorch: the rank process, Gloo's threads included). It does not "
          "depend on how busy the machine is, unlike the wall times.")

    print("\n### Per-op time on tiny tensors (thread CPU ns per call; the kernel is negligible)\n")
    print("| op | PyTorch eager ns | ours ns | torch / ours |\n|---|---|---|---|")
    for name, torch_ns in overhead_rows():
        ours = ours_oh.get(name)
        ours_ns = ours["cpu_time"] if ours else float("nan")
        ratio = torch_ns / ours_ns if ours else float("nan")
        print("| %s | %.0f | %.0f | %.1fx |" % (name, torch_ns, ours_ns, ratio))
        result["per_op"].append({"row": name, "torch_ns": torch_ns, "ours_ns": ours_ns,
                                 "torch_over_ours": ratio})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
