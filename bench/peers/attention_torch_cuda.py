"""The GPU peer of //bench:attention_bench's Kernel rows: PyTorch's fused causal attention.

torch.nn.functional.scaled_dot_product_attention(is_causal=True) on bf16 [batch, heads, seq,
head_dim] tensors, forward + backward, with the flash backend forced (falling back to PyTorch's
default choice where flash is unavailable, named in the output). Timed with CUDA events, the
median of --reps after --warmup untimed runs. TFLOP/s counts what attention_bench counts: the 2
forward and 5 backward [t, t, d] products of 2 t^2 d flops each, halved by causality (7 b h t^2 d).

One JSON object per shape and line (with --json, appended to that file too):
  {"impl": "torch_sdpa", "backend": "flash", "batch": 16, "seq": 1024, "heads": 12,
   "head_dim": 64, "ms": ..., "tflops": ...}

    python3 bench/peers/attention_torch_cuda.py --json=/tmp/attn_torch.jsonl
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

# attention_bench's SM_KERNEL_SHAPES: (batch, seq, heads, head_dim).
SHAPES = [(16, 1024, 12, 64), (8, 1024, 6, 128)]


def run(shape, warmup, reps):
    b, t, h, d = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, dout = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    backend = "flash"
    ctx = None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        backend = "default"

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(dout)

    def guarded():
        if ctx is None:
            step()
        else:
            with ctx():
                step()

    try:
        guarded()
    except RuntimeError:
        ctx, backend = None, "default"
        guarded()
    for _ in range(warmup):
        guarded()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        guarded()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    ms = statistics.median(times)
    flops = 7.0 * b * h * t * t * d
    return {"impl": "torch_sdpa", "backend": backend, "batch": b, "seq": t, "heads": h,
            "head_dim": d, "ms": ms, "tflops": flops / (ms * 1e-3) * 1e-12}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default="")
    a = p.parse_args()
    for shape in SHAPES:
        row = run(shape, a.warmup, a.reps)
        line = json.dumps(row)
        print(line, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
