#!/usr/bin/env python3
"""PyTorch on the GPU for the cases of //bench:cuda_bench's ops/ (bench/cuda_bench_ops.cc).

Same names, shapes and traffic (bytes an ideal kernel reads + writes); each case timed with CUDA
events (3 warm-up calls, then 5 timed runs of 5 calls, the median) against a device-to-device
copy of the same traffic. Also the GEMMs of cuda_bench's gemm/ cases (torch.matmul / bmm; f32
without TF32). Prints one JSON object per line:
  {"name": "ops/layer_norm_fwd/rows:16384/h:4096/dtype:f32", "ms": 0.18, "copy_ms": 0.13}
  {"name": "gemm/dtype:bf16/m:8192/k:8192/n:8192", "ms": 1.37}
Run: python3 bench/peers/torch_cuda_ops.py > torch_ops.jsonl   (bench/peers/cuda_ops_table.sh)
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F

DEV = "cuda"
ROWS, H, ELEMS = 16384, 4096, 1 << 26
DT = {"f32": torch.float32, "bf16": torch.bfloat16}


def rand(shape, dt, lo=-1.0, hi=1.0):
    return (torch.rand(shape, device=DEV, dtype=torch.float32) * (hi - lo) + lo).to(dt)


def time_ms(fn, reps=5, runs=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def copy_ms(traffic):
    n = int(traffic // 2)
    src = torch.zeros(n, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return time_ms(lambda: dst.copy_(src))


def layer_norm_bwd(dt):
    x = rand((ROWS, H), dt).requires_grad_()
    g = rand((H,), dt).requires_grad_()
    b = rand((H,), dt).requires_grad_()
    dy = rand((ROWS, H), dt)
    y = F.layer_norm(x, (H,), g, b, 1e-5)
    return lambda: torch.autograd.grad(y, (x, g, b), dy, retain_graph=True)


def rms_norm_bwd(dt):
    x = rand((ROWS, H), dt).requires_grad_()
    g = rand((H,), dt).requires_grad_()
    dy = rand((ROWS, H), dt)
    y = F.rms_norm(x, (H,), g, 1e-6)
    return lambda: torch.autograd.grad(y, (x, g), dy, retain_graph=True)


def softmax_bwd(dt):
    x = rand((ROWS, H), dt, -4, 4).requires_grad_()
    dy = rand((ROWS, H), dt)
    y = torch.softmax(x, -1)
    return lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True)


def causal_softmax(dt):
    s = rand((16, 12, 1024, 1024), dt, -4, 4)
    mask = torch.ones(1024, 1024, dtype=torch.bool, device=DEV).triu(1)
    return lambda: torch.softmax(s.masked_fill(mask, float("-inf")), -1)


def cross_entropy(dt, backward):
    logits = rand((8192, 50304), dt, -4, 4).requires_grad_(backward)
    t = torch.randint(0, 50304, (8192,), device=DEV)
    if not backward:
        return lambda: F.cross_entropy(logits, t, reduction="none")
    loss = F.cross_entropy(logits, t, reduction="none")
    dl = rand((8192,), loss.dtype)
    return lambda: torch.autograd.grad(loss, (logits,), dl, retain_graph=True)


def gelu_bwd(dt):
    x = rand((ELEMS,), dt, -4, 4).requires_grad_()
    dy = rand((ELEMS,), dt)
    y = F.gelu(x, approximate="tanh")
    return lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True)


def adamw(_):
    ps = [rand((ELEMS // 4,), torch.float32) for _ in range(4)]
    for p, g in zip(ps, [rand((ELEMS // 4,), torch.float32) for _ in range(4)]):
        p.grad = g
    opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.1, fused=True)
    return opt.step


def cases():
    es = {"f32": 4, "bf16": 2}
    n2 = ROWS * H
    ln = lambda dt: (lambda x, g, b: (lambda: F.layer_norm(x, (H,), g, b, 1e-5)))(
        rand((ROWS, H), dt), rand((H,), dt), rand((H,), dt))
    rn = lambda dt: (lambda x, g: (lambda: F.rms_norm(x, (H,), g, 1e-6)))(
        rand((ROWS, H), dt), rand((H,), dt))
    sm = lambda dt: (lambda x: (lambda: torch.softmax(x, -1)))(rand((ROWS, H), dt, -4, 4))
    gelu = lambda dt: (lambda x: (lambda: F.gelu(x, approximate="tanh")))(
        rand((ELEMS,), dt, -4, 4))

    def cast(dt):
        x = rand((ELEMS,), dt)
        to = torch.bfloat16 if dt == torch.float32 else torch.float32
        return lambda: x.to(to)

    t = 16 * 12 * 1024 * 1024
    v = 8192 * 50304
    return [
        ("layer_norm_fwd/rows:16384/h:4096", ln, lambda e: 2 * n2 * e),
        ("layer_norm_bwd/rows:16384/h:4096", layer_norm_bwd, lambda e: 3 * n2 * e),
        ("rms_norm_fwd/rows:16384/h:4096", rn, lambda e: 2 * n2 * e),
        ("rms_norm_bwd/rows:16384/h:4096", rms_norm_bwd, lambda e: 3 * n2 * e),
        ("softmax_fwd/rows:16384/h:4096", sm, lambda e: 2 * n2 * e),
        ("softmax_bwd/rows:16384/h:4096", softmax_bwd, lambda e: 3 * n2 * e),
        ("causal_softmax_fwd/b:16/h:12/t:1024", causal_softmax, lambda e: 2 * t * e),
        ("cross_entropy_fwd/rows:8192/v:50304", lambda dt: cross_entropy(dt, False),
         lambda e: v * e),
        ("cross_entropy_bwd/rows:8192/v:50304", lambda dt: cross_entropy(dt, True),
         lambda e: 2 * v * e),
        ("gelu_fwd/elems:67108864", gelu, lambda e: 2 * ELEMS * e),
        ("gelu_bwd/elems:67108864", gelu_bwd, lambda e: 3 * ELEMS * e),
        ("cast_to_other/elems:67108864", cast, lambda e: 6 * ELEMS),
    ], es


GEMM_DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def gemm_cases():
    """(name, m, k, n, batch, dtype) as bench/cuda_bench.cc registers them."""
    out = []
    for dt in ("bf16", "f16", "f32"):
        out += [(8192, 8192, 8192, 1, dt), (8192, 4096, 16384, 1, dt)]
    out += [(4096, 4096, 4096, 1, "f32"), (2048, 128, 2048, 32, "bf16")]
    for d in (768, 1600, 4096, 8192):
        out += [(8192, d, 3 * d, 1, "bf16"), (8192, d, d, 1, "bf16"),
                (8192, d, 4 * d, 1, "bf16"), (8192, 4 * d, d, 1, "bf16")]
    out += [(1024, 64, 1024, 96, "bf16"), (1024, 1024, 64, 96, "bf16")]
    named = []
    for m, k, n, b, dt in out:
        name = f"gemm/dtype:{dt}/m:{m}/k:{k}/n:{n}" + (f"/batch:{b}" if b > 1 else "")
        named.append((name, m, k, n, b, dt))
    return named


def run_gemms():
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 as ours: CUBLAS_COMPUTE_32F
    for name, m, k, n, b, dt in gemm_cases():
        try:
            t = GEMM_DT[dt]
            a = rand((b, m, k) if b > 1 else (m, k), t)
            w = rand((b, k, n) if b > 1 else (k, n), t)
            fn = (lambda: torch.bmm(a, w)) if b > 1 else (lambda: torch.matmul(a, w))
            ms = time_ms(fn, reps=2 if dt == "f32" else 5)
            print(json.dumps({"name": name, "ms": ms, "flops": 2.0 * b * m * n * k}), flush=True)
            del a, w, fn
        except Exception as e:
            print(json.dumps({"name": name, "error": str(e)[:200]}), flush=True)
        torch.cuda.empty_cache()


def main():
    if not torch.cuda.is_available():
        print("torch_cuda_ops: no GPU; nothing to measure", file=sys.stderr)
        return 0
    run_gemms()
    table, es = cases()
    rows = []
    for name, make, traffic in table:
        for dts in ("f32", "bf16"):
            rows.append((f"ops/{name}/dtype:{dts}", lambda m=make, d=DT[dts]: m(d),
                         traffic(es[dts])))
    rows.append(("ops/adamw/params:67108864/dtype:f32", lambda: adamw(None), 28 * ELEMS))
    for name, make, traffic in rows:
        try:
            fn = make()
            ms = time_ms(fn)
            del fn
            torch.cuda.empty_cache()
            print(json.dumps({"name": name, "ms": ms, "copy_ms": copy_ms(traffic),
                              "traffic_bytes": traffic}), flush=True)
        except Exception as e:  # one failing case must not hide the others
            print(json.dumps({"name": name, "error": str(e)[:200]}), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
