#!/usr/bin/python3
"""PyTorch's torch.distributed all_reduce over Gloo, on the sizes and world sizes of
//bench:collectives_bench's all_reduce rows, and a side-by-side report with ours.

Measure (one process per rank, torch.multiprocessing, TCP loopback, f32, 1 intra-op thread):
  /usr/bin/python3 bench/peers/torch_collectives.py --worlds=2,4 --json=torch.json
Report (best time per config over every file given; ours from the bench's --benchmark_out):
  /usr/bin/python3 bench/peers/torch_collectives.py --report --ours=a.json,b.json --torch=torch.json
Normally run through bench/peers/torch_collectives.sh, which does both, interleaved.

Timing mirrors the C++ bench: 2 warm-up calls, a barrier, `iters` calls, a barrier; time per call
on rank 0; iters = clamp(2^30 / (4 * bytes), 3, 2000). busbw = bytes / time * 2(n-1)/n.
"""
import argparse
import json
import os
import re
import sys
import time

SIZES = [4 << 10 << (2 * k) for k in range(8)]  # 4 KiB .. 64 MiB


def iters_for(nbytes):
    return max(3, min(2000, (1 << 30) // (nbytes * 4)))


def busbw(nbytes, seconds, world):
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def worker(rank, world, port, sizes, queue):
    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for nbytes in sizes:
        x = torch.full((nbytes // 4,), 1.0 + rank, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(x)
        dist.barrier()
        start = time.perf_counter()
        n = iters_for(nbytes)
        for _ in range(n):
            dist.all_reduce(x)
        dist.barrier()
        results[nbytes] = (time.perf_counter() - start) / n
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(worlds, sizes):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    rows = []
    for world in worlds:
        queue = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, world, port, sizes, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        results = queue.get(timeout=1800)
        for p in procs:
            p.join()
            if p.exitcode != 0:
                sys.exit(f"torch_collectives: a rank of world {world} exited with {p.exitcode}")
        for nbytes, seconds in sorted(results.items()):
            rows.append({"world": world, "bytes": nbytes, "seconds": seconds})
            print(f"torch gloo all_reduce world {world} bytes {nbytes:>9}: "
                  f"{seconds * 1e6:10.1f} us  busbw {busbw(nbytes, seconds, world):6.2f} GB/s",
                  flush=True)
    return rows


def best_times(rows):
    best = {}
    for r in rows:
        key = (r["backend"], r["world"], r["bytes"])
        best[key] = min(best.get(key, float("inf")), r["seconds"])
    return best


def load_ours(path):
    name = re.compile(r"^all_reduce/backend:(\w+)/world:(\d+)/bytes:(\d+)/")
    unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    rows = []
    for b in json.load(open(path))["benchmarks"]:
        m = name.match(b["name"])
        if m and "error_occurred" not in b:
            rows.append({"backend": m.group(1), "world": int(m.group(2)),
                         "bytes": int(m.group(3)),
                         "seconds": b["real_time"] * unit[b.get("time_unit", "ns")]})
    return rows


def report(ours_files, torch_files):
    rows = []
    for f in ours_files:
        rows += load_ours(f)
    for f in torch_files:
        rows += [dict(r, backend="torch") for r in json.load(open(f))]
    best = best_times(rows)
    print("\n# all_reduce f32, best of the runs given; busbw GB/s (time us)")
    print("# ratios: torch/ours_gloo time (>= 0.9 means ours within 10% of PyTorch's), "
          "gloo/in_process time (target >= 3 at 16 MiB)")
    print(f"{'ranks':>5} {'size(B)':>10} {'ours gloo':>20} {'torch gloo':>20} "
          f"{'in_process':>20} {'torch/ours':>10} {'ours_gloo/inproc':>16} {'torch/inproc':>12}")
    for (backend, world, nbytes) in sorted(k for k in best if k[0] == "gloo"):
        ours = best[("gloo", world, nbytes)]
        torch = best.get(("torch", world, nbytes))
        inproc = best.get(("in_process", world, nbytes))

        def cell(t):
            return f"{busbw(nbytes, t, world):7.2f} ({t * 1e6:9.1f})" if t else f"{'-':>20}"

        def ratio(a, b, width):
            return f"{a / b:{width}.2f}" if a and b else f"{'-':>{width}}"

        print(f"{world:>5} {nbytes:>10} {cell(ours):>20} {cell(torch):>20} {cell(inproc):>20} "
              f"{ratio(torch, ours, 10)} {ratio(ours, inproc, 16)} {ratio(torch, inproc, 12)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--min_bytes", type=int, default=4 << 10)
    ap.add_argument("--max_bytes", type=int, default=64 << 20)
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--ours", default="", help="comma-separated collectives_bench JSON files")
    ap.add_argument("--torch", default="", help="comma-separated files written by --json")
    a = ap.parse_args()
    if a.report:
        report([f for f in a.ours.split(",") if f], [f for f in a.torch.split(",") if f])
        return
    rows = measure([int(w) for w in a.worlds.split(",")], [s for s in SIZES if a.min_bytes <= s <= a.max_bytes])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
