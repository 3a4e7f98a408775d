"""PyTorch's CPU kernels on the ops and shapes of //bench:tensor_bench's op rows, one thread.

    /usr/bin/python3 bench/peers/torch_ops.py [--ours=tensor_bench.json] [--min_time=0.3]
    /usr/bin/python3 bench/peers/torch_ops.py --torch_out=torch_1.json     # measure only
    /usr/bin/python3 bench/peers/torch_ops.py --ours=a.json,b.json --torch=torch_1.json,torch_2.json
    /usr/bin/python3 bench/peers/torch_ops.py --filter='^gelu_erf' ...      # some rows only

Prints one line per row: PyTorch's time (thread CPU time per call, median of repeats) and, given
the JSON output of tensor_bench (--benchmark_format=json --benchmark_out=FILE), ours beside it
and their ratio (torch / ours: > 1 means we are faster). Given as many --ours files as --torch
files (alternating rounds), it also prints the lowest, median and highest ratio of a round's pair.

Both sides start each call in the same cache state: tensor_bench copies (bytes read + bytes
written) / 2 of other memory after every call (its copy_ratio baseline), which evicts much of a
16 MiB input from this machine's 32 MiB L3, so PyTorch's calls here are separated by the same
untimed copy. Without it PyTorch re-reads an L3-resident input: its row sums measured 0.26-0.28
ms that way and 0.48-0.67 ms with the copy (ours: 0.50). Each PyTorch call computes what ours returns or must compute: the layer-norm
backward produces dx, dgamma and dbeta, as LayerNormBackward does.

Use bench/peers/torch_ops.sh, which installs Debian's python3-torch if missing and runs both.
"""
import argparse
import json
import re
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
aten = torch.ops.aten


def timed(fn, min_time, copy_bytes=0):
    """Median thread CPU seconds per call over >= min_time of calls (after a warm-up call), each
    call preceded by an untimed copy of copy_bytes (tensor_bench's interleaved memcpy)."""
    src = torch.ones(copy_bytes, dtype=torch.uint8)
    dst = torch.zeros(copy_bytes, dtype=torch.uint8)
    fn()
    samples = []
    spent = 0.0
    while spent < min_time or len(samples) < 3:
        if copy_bytes:
            dst.copy_(src)
        t0 = time.thread_time()
        fn()
        dt = time.thread_time() - t0
        samples.append(dt)
        spent += dt
    samples.sort()
    return samples[len(samples) // 2]


def rows():
    """(name, fn, copy_bytes) triples, named exactly as tensor_bench's rows, with the bytes of
    its interleaved copy: numel * 4 * (tensors read + tensors written) / 2, as its OpRow says."""
    out = []
    g = torch.Generator().manual_seed(1)
    for shape in [(4194304,), (512, 2048)]:
        tag = ("elems:%d" % shape[0]) if len(shape) == 1 else "rows:%d/cols:%d" % shape
        x = torch.randn(shape, generator=g) * 2
        dy = torch.randn(shape, generator=g)
        pos = torch.rand(shape, generator=g) * 10 + 0.01
        numel = x.numel()
        ops = [  # (name, fn, tensors read, tensors written)
            ("exp", lambda x=x: torch.exp(x), 1, 1),
            ("log", lambda p=pos: torch.log(p), 1, 1),
            ("tanh", lambda x=x: torch.tanh(x), 1, 1),
            ("silu", lambda x=x: F.silu(x), 1, 1),
            ("gelu_erf", lambda x=x: F.gelu(x), 1, 1),
            ("gelu_tanh", lambda x=x: F.gelu(x, approximate="tanh"), 1, 1),
            ("gelu_erf_grad", lambda x=x, d=dy: aten.gelu_backward(d, x, approximate="none"), 2, 1),
            ("gelu_tanh_grad", lambda x=x, d=dy: aten.gelu_backward(d, x, approximate="tanh"),
             2, 1),
            ("silu_grad", lambda x=x, d=dy: aten.silu_backward(d, x), 2, 1),
        ]
        out += [("%s/f32/%s" % (n, tag), f, numel * 4 * (r + w) // 2) for n, f, r, w in ops]
    # Lambdas bind their tensors through default arguments: a closure would see the last shape.
    for n_rows, cols in [(4096, 1024), (512, 8192)]:
        tag = "rows:%d/cols:%d" % (n_rows, cols)
        x = torch.randn(n_rows, cols, generator=g) * 2
        dy = torch.randn(n_rows, cols, generator=g)
        y = torch.softmax(x, -1)
        ly = torch.log_softmax(x, -1)
        gamma, beta = torch.randn(cols, generator=g), torch.randn(cols, generator=g)
        _, mean, rstd = aten.native_layer_norm(x, [cols], gamma, beta, 1e-5)
        t = torch.randint(0, cols, (n_rows,), generator=g)
        dloss = torch.rand(n_rows, generator=g) + 0.5
        total = torch.tensor(1.0)

        def rms(x=x, gamma=gamma):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma

        def ce_backward(x=x, t=t, dloss=dloss, total=total):
            lsm = torch.log_softmax(x, -1)
            d = aten.nll_loss_backward(dloss, lsm, t, None, 0, -100, total)
            return aten._log_softmax_backward_data(d, lsm, -1, torch.float32)

        ops = [  # (name, fn, tensors read, tensors written), as tensor_bench's OpRows
            ("softmax", lambda x=x: torch.softmax(x, -1), 1, 1),
            ("log_softmax", lambda x=x: torch.log_softmax(x, -1), 1, 1),
            ("softmax_backward",
             lambda y=y, d=dy: aten._softmax_backward_data(d, y, -1, torch.float32), 2, 1),
            ("log_softmax_backward",
             lambda y=ly, d=dy: aten._log_softmax_backward_data(d, y, -1, torch.float32), 2, 1),
            ("layer_norm", lambda x=x, c=cols, w=gamma, b=beta: F.layer_norm(x, (c,), w, b, 1e-5),
             1, 1),
            ("layer_norm_backward",
             lambda x=x, d=dy, m=mean, r=rstd, c=cols, w=gamma, b=beta:
             aten.native_layer_norm_backward(d, x, [c], m, r, w, b, [True, True, True]), 2, 1),
            ("rms_norm", rms, 1, 1),  # composed: PyTorch 1.13 has no fused RMSNorm
            ("cross_entropy", lambda x=x, t=t: F.cross_entropy(x, t, reduction="none"), 1, 0),
            ("cross_entropy_backward", ce_backward, 1, 1),  # two kernels, forward included
            ("sum", lambda x=x: x.sum(-1), 1, 0),
            ("mean", lambda x=x: x.mean(-1), 1, 0),
            ("max", lambda x=x: x.amax(-1), 1, 0),
            ("transpose", lambda x=x: x.t().contiguous(), 1, 1),
        ]
        numel = n_rows * cols
        out += [("%s/f32/%s" % (n, tag), f, numel * 4 * (r + w) // 2) for n, f, r, w in ops]

    # The Megatron MLP block at TP 1, forward + backward (autograd), as BM_MegatronMlp.
    tokens, hidden, ffn = 512, 512, 2048
    mx = torch.randn(tokens, hidden, generator=g, requires_grad=True)
    mdy = torch.randn(tokens, hidden, generator=g)
    fc1, fc2 = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)

    def mlp():
        y = fc2(F.gelu(fc1(mx), approximate="tanh"))
        y.backward(mdy)

    out.append(("mlp/f32/tokens:512/hidden:512/ffn:2048", mlp, 0))  # BM_MegatronMlp: no copy
    return out


def load_ours(paths):
    """{row: (seconds, copy_ratio)} from tensor_bench JSON files: per row the fastest run of its
    median_ms counter (a median, as timed() takes PyTorch's)."""
    ours = {}
    for path in paths:
        with open(path) as f:
            for b in json.load(f)["benchmarks"]:
                name = b["name"].replace("/manual_time", "").replace("/process_time", "")
                if name.startswith("mlp/"):  # Google Benchmark appends the Args values
                    name = "/".join(name.split("/")[:5])
                t = b["median_ms"] * 1e-3
                if name not in ours or t < ours[name][0]:
                    ours[name] = (t, b.get("copy_ratio"))
    return ours


def round_ratios(ours_paths, torch_paths):
    """{row: [torch_i / ours_i]} over the rounds' pairs (file i of each side)."""
    out = {}
    for op, tp in zip(ours_paths, torch_paths):
        ours = load_ours([op])
        with open(tp) as f:
            for name, t in json.load(f).items():
                if name in ours:
                    out.setdefault(name, []).append(t / ours[name][0])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="tensor_bench --benchmark_format=json outputs, comma-separated "
                    "(per row the fastest)")
    ap.add_argument("--torch", help="outputs of earlier --torch_out runs, comma-separated: "
                    "combine them (per row the fastest) instead of measuring")
    ap.add_argument("--torch_out", help="measure PyTorch's rows only and write them here (JSON)")
    ap.add_argument("--min_time", type=float, default=0.3)
    ap.add_argument("--filter", default="", help="only the rows whose name matches (re.search)")
    args = ap.parse_args()
    selected = [r for r in rows() if re.search(args.filter, r[0])]
    if args.torch_out:
        times = {name: timed(fn, args.min_time, copy_bytes) for name, fn, copy_bytes in selected}
        with open(args.torch_out, "w") as f:
            json.dump(times, f)
        return
    ours = load_ours(args.ours.split(",")) if args.ours else {}
    measured = None
    if args.torch:
        measured = {}
        for path in args.torch.split(","):
            with open(path) as f:
                for name, t in json.load(f).items():
                    measured[name] = min(t, measured.get(name, t))
    spread = {}
    if args.ours and args.torch and len(args.ours.split(",")) == len(args.torch.split(",")) > 1:
        spread = round_ratios(args.ours.split(","), args.torch.split(","))
    print("torch %s, %d thread(s)" % (torch.__version__, torch.get_num_threads()))
    print("%-48s %10s %10s %8s %10s %s" % ("op", "torch ms", "ours ms", "torch/us", "ours/copy",
                                          "rounds' torch/us min / median / max" if spread else ""))
    for name, fn, copy_bytes in selected:
        t = measured[name] if measured is not None else timed(fn, args.min_time, copy_bytes)
        o = ours.get(name)
        if o:
            cr = "%10.2f" % o[1] if o[1] is not None else "%10s" % "-"
            r = spread.get(name)
            sp = " %.2f / %.2f / %.2f" % (min(r), sorted(r)[len(r) // 2], max(r)) if r else ""
            print("%-48s %10.3f %10.3f %8.2f %s%s" % (name, t * 1e3, o[0] * 1e3, t / o[0], cr, sp))
        else:
            print("%-48s %10.3f %10s %8s %10s" % (name, t * 1e3, "-", "-", "-"))


if __name__ == "__main__":
    main()
