"""The TP MLP of //bench:tp_bench (tokens 512, hidden 512, ffn 2048, f32, forward + backward,
no sequence parallelism) written Megatron-style in PyTorch eager with torch.distributed over Gloo,
one process and one intra-op thread per rank; and PyTorch eager's per-op time on 1-element
tensors, the peer of //bench:overhead_bench's add/matmul rows.

    /usr/bin/python3 bench/peers/tp_mlp_torch.py [--tp=1,2,4] [--steps=10] \
        [--ours_tp=tp_bench.json] [--ours_overhead=overhead_bench.json] [--json=OUT]

Use bench/peers/tp_mlp_torch.sh, which installs Debian's python3-torch if missing, runs ours
(Google Benchmark JSON) and this, and prints them side by side (ratio torch / ours: > 1 means we
are faster). Timing matches tp_bench: each step is fenced by barriers and timed on rank 0 (wall);
the mean over the measured steps is reported.
"""
import argparse
import json
import os
import socket
import statistics
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

    times = []
    for i in range(warmup + steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(times)
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
    times = q.get(timeout=600)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError("rank process failed with exit code %s" % p.exitcode)
    return times


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


def load_bench(path):
    if not path:
        return {}
    with open(path) as f:
        return {b["name"]: b for b in json.load(f)["benchmarks"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--ours_tp", default="")
    ap.add_argument("--ours_overhead", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    ours_tp, ours_oh = load_bench(args.ours_tp), load_bench(args.ours_overhead)
    result = {"torch_version": torch.__version__, "tp_mlp": [], "per_op": []}

    print("### TP MLP fwd+bwd (tokens 512, hidden 512, ffn 2048, f32, no SP): PyTorch + Gloo vs ours\n")
    print("| TP | PyTorch+Gloo ms | ours ms | torch / ours |\n|---|---|---|---|")
    for tp in [int(t) for t in args.tp.split(",")]:
        times = run_tp(tp, args.steps)
        torch_ms = 1e3 * statistics.mean(times)
        name = "mlp/tp:%d/tokens:512/d:512/fwd_bwd/iterations:%d/manual_time"
        ours = next((b for k, b in ours_tp.items()
                     if k.startswith("mlp/tp:%d/tokens:512/d:512/fwd_bwd/" % tp)), None)
        ours_ms = ours["real_time"] if ours else float("nan")
        ratio = torch_ms / ours_ms if ours else float("nan")
        print("| %d | %.2f | %.2f | %.2fx |" % (tp, torch_ms, ours_ms, ratio))
        result["tp_mlp"].append({"tp": tp, "torch_ms": torch_ms, "ours_ms": ours_ms,
                                 "torch_over_ours": ratio})

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
