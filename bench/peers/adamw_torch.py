"""torch.optim.AdamW(foreach=True) on the tensors of //bench:adamw_bench (one GPT-2 124M block's
parameters, f32, one thread), and the ratio to ours.

    /usr/bin/python3 bench/peers/adamw_torch.py [--ours=adamw_bench.json] [--min_time=2]

Prints PyTorch's median seconds per step (after a warm-up step that makes its moments) and,
given adamw_bench's JSON (--benchmark_format=json --benchmark_out=FILE), ours and
torch / ours (> 1: ours is faster). Use /usr/bin/python3: Debian's python3-torch.
"""
import argparse
import json
import time

import torch

torch.set_num_threads(1)

SHAPES = [(768,), (768,), (768, 2304), (2304,), (768, 768), (768,),
          (768,), (768,), (768, 3072), (3072,), (3072, 768), (768,)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", default="")
    ap.add_argument("--min_time", type=float, default=2.0)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    opt = torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=True)
    opt.step()  # the moments
    samples = []
    start = time.perf_counter()
    while time.perf_counter() - start < a.min_time or len(samples) < 5:
        t0 = time.thread_time()
        opt.step()
        samples.append(time.thread_time() - t0)
    samples.sort()
    torch_s = samples[len(samples) // 2]
    n = sum(p.numel() for p in params)
    print(f"torch.optim.AdamW(foreach=True): {torch_s * 1e3:.3f} ms/step over {n} f32 elements "
          f"({len(samples)} steps, median)")
    if a.ours:
        with open(a.ours) as f:
            rows = json.load(f)["benchmarks"]
        row = next(r for r in rows if r["name"].startswith("BM_AdamWStepGpt2Block"))
        scale = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[row["time_unit"]]
        ours_s = row["cpu_time"] * scale
        print(f"ours (fused, in place): {ours_s * 1e3:.3f} ms/step; torch / ours = "
              f"{torch_s / ours_s:.2f}")


if __name__ == "__main__":
    main()
