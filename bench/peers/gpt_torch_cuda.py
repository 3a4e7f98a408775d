"""The GPU peer of //bench:gpt_bench --device=cuda: the same GPT-2 training step in PyTorch.

GPT-2 as models/gpt.h defines it (learned wte/wpe, pre-LN eps 1e-5, biased attention scaled by
1/sqrt(head_dim), tanh GELU, final LN, lm_head tied to wte, mean cross-entropy, no dropout), with
what a PyTorch user runs on a GPU: bf16 autocast (f32 master weights), scaled_dot_product_attention
(causal), fused AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on >= 2-dim
parameters) and global-norm clipping at 1.0; eager, then torch.compile. Batches follow the C++
rule (sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T+T+1) of bench::RandomTokens's stream).

Per mode it prints one line and, with --json, appends one JSON object per line:
  {"impl": "torch", "mode": "eager", "tokens_per_s": ..., "step_ms": ..., "mfu": ...,
   "peak_bytes": ..., "loss_first": ..., "loss_last": ..., ...}
MFU = (6 N + 12 L d T) tokens/s over the card's dense bf16 peak (N: every parameter, wte once;
12 L d T: attention's score and value products, as nanoGPT's estimate_mfu), None for an unknown
card.

    python3 bench/peers/gpt_torch_cuda.py                        # GPT-2 124M, batch 16, seq 1024
    python3 bench/peers/gpt_torch_cuda.py --layers=2 --d_model=64 --heads=4 --vocab=256 \
        --seq=64 --batch=8 --modes=eager --json=/tmp/peer.jsonl
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Dense bf16 tensor-core peaks (FLOP/s) from NVIDIA's data sheets (SXM parts; sparsity not
# counted). The H200 has the H100's compute with more, faster memory.
PEAKS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362.05e12}


def card_peak(name):
    for key, flops in PEAKS.items():
        if key in name:
            return flops
    return None


def tokens(n, vocab):
    """bench::RandomTokens (bench/bench_tokens.h): Knuth's MMIX LCG, high bits, mod vocab."""
    x, out, mask = 7, [], (1 << 64) - 1
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & mask
        out.append((x >> 33) % vocab)
    return torch.tensor(out, dtype=torch.long)


def batch_at(data, step, batch, seq):
    n = data.numel()
    starts = (torch.arange(batch) + step * batch) * seq % n
    idx = (starts[:, None] + torch.arange(seq + 1)[None, :]) % n
    x = data[idx]
    return x[:, :-1], x[:, 1:]


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(o.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.vocab = a.vocab
        self.wte = nn.Embedding(a.vocab, a.d_model)
        self.wpe = nn.Embedding(a.seq, a.d_model)
        self.h = nn.ModuleList(Block(a.d_model, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.d_model, eps=1e-5)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                proj = name.endswith(("c_proj.weight", "mlp_proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * a.layers) if proj else 0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, self.vocab), targets.reshape(-1))


def run(a, mode, data, peak):
    torch.manual_seed(a.seed)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = Gpt(a).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    dtype = torch.bfloat16 if a.dtype == "bf16" else None

    def step(s):
        x, y = batch_at(data, s, a.batch, a.seq)
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype is not None):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    losses = []
    for s in range(a.warmup):
        losses.append(step(s).item())
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for s in range(a.warmup, a.warmup + a.steps):
        loss = step(s)
    end.record()
    torch.cuda.synchronize()
    losses.append(loss.item())
    ms = start.elapsed_time(end) / a.steps
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * n_params + 12 * a.layers * a.d_model * a.seq
    tps = a.batch * a.seq / (ms / 1e3)
    return {"impl": "torch", "torch": torch.__version__, "mode": mode, "dtype": a.dtype,
            "card": torch.cuda.get_device_name(), "layers": a.layers, "d_model": a.d_model,
            "heads": a.heads, "vocab": a.vocab, "seq": a.seq, "batch": a.batch,
            "params": n_params, "step_ms": ms, "tokens_per_s": tps,
            "mfu": None if peak is None else flops_per_token * tps / peak,
            "peak_bytes": torch.cuda.max_memory_allocated(),
            "loss_first": losses[0], "loss_last": losses[-1]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d_model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile happens here)")
    p.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="", help="append one JSON object per mode to this file")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpt_torch_cuda.py: no CUDA device visible to PyTorch; run it on the GPU machine")
    if a.d_model % a.heads:
        sys.exit(f"gpt_torch_cuda.py: --d_model {a.d_model} is not divisible by --heads {a.heads}")
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 matmuls as ours: no TF32
    torch.backends.cudnn.allow_tf32 = False
    data = tokens(max(1 << 16, (a.warmup + a.steps) * a.batch * a.seq + 1), a.vocab)
    peak = card_peak(torch.cuda.get_device_name())
    for mode in a.modes.split(","):
        if mode not in ("eager", "compile"):
            sys.exit(f"gpt_torch_cuda.py: unknown mode '{mode}' (eager or compile)")
        r = run(a, mode, data, peak)
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        print(f"torch {mode:8s} {r['card']}: {r['tokens_per_s']:10.0f} tokens/s  "
              f"{r['step_ms']:8.2f} ms/step  MFU {mfu}  peak {r['peak_bytes'] / 2**30:.2f} GiB  "
              f"loss {r['loss_first']:.4f} -> {r['loss_last']:.4f}", flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
