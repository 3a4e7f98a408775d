"""The peer of //bench:gpt_bench: the same GPT-2 training step in PyTorch eager on the CPU.

GPT-2 (4 layers, d_model 256, 8 heads, seq 256, vocab 256, batch 8, f32; learned wte/wpe,
pre-LN eps 1e-5, tanh GELU, tied lm_head, mean cross-entropy, AdamW + global-norm clipping 1.0),
the same token stream and batch rule as the C++ benchmark (sample b of step s is tokens
[(s*B+b)*T, (s*B+b)*T+T+1) of the data, wrapping around). Prints tokens/s for 1 thread, 2 threads
and DDP over Gloo with 2 processes x 1 thread (each process half of the batch).

    /usr/bin/python3 bench/peers/gpt_torch.py      # needs Debian's python3-torch
"""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS, D, HEADS, VOCAB, SEQ, BATCH = 4, 256, 8, 256, 256, 8
WARMUP, MEASURED = 1, 4


def tokens():
    x, out, mask = 7, [], (1 << 64) - 1
    for _ in range(1 << 16):
        x = (x * 6364136223846793005 + 1442695040888963407) & mask
        out.append((x >> 33) % 256)
    return torch.tensor(out, dtype=torch.long)


def batch_at(data, step, batch, seq, first=0, count=None):
    count = batch if count is None else count
    n = data.numel()
    rows = []
    for b in range(first, first + count):
        start = ((step * batch + b) * seq) % n
        idx = (torch.arange(seq + 1) + start) % n
        rows.append(data[idx])
    x = torch.stack(rows)
    return x[:, :-1], x[:, 1:]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, eps=1e-5)
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.ln_2 = nn.LayerNorm(D, eps=1e-5)
        self.c_fc = nn.Linear(D, 4 * D)
        self.mlp_proj = nn.Linear(4 * D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        hd = D // HEADS
        q, k, v = (z.view(b, t, HEADS, hd).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        o = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, D)
        x = x + self.c_proj(o)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(SEQ, D)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D, eps=1e-5)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def optimizer(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.95), eps=1e-8)


def train(model, opt, data, first, count, step_hook=None):
    times = []
    for step in range(WARMUP + MEASURED):
        t0 = time.perf_counter()
        x, y = batch_at(data, step, BATCH, SEQ, first, count)
        loss = model(x, y) * (count / BATCH)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step_hook:
            step_hook(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - t0)
    return BATCH * SEQ * len(times) / sum(times)


def single(threads):
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = Gpt()
    return train(model, optimizer(model), tokens(), 0, BATCH)


def ddp_worker(rank, world, port, out):
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = torch.nn.parallel.DistributedDataParallel(Gpt())
    rate = train(model, optimizer(model), tokens(), rank * BATCH // world, BATCH // world)
    if rank == 0:
        out.put(rate)
    dist.destroy_process_group()


def ddp(world=2):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=ddp_worker, args=(r, world, 29511, q)) for r in range(world)]
    for p in procs:
        p.start()
    rate = q.get()
    for p in procs:
        p.join()
    return rate


if __name__ == "__main__":
    print(f"PyTorch {torch.__version__} eager, GPT-2 {LAYERS}x{D}, {HEADS} heads, seq {SEQ}, "
          f"vocab {VOCAB}, batch {BATCH}, f32")
    print(f"torch/threads:1      {single(1):10.0f} tokens/s")
    print(f"torch/threads:2      {single(2):10.0f} tokens/s")
    print(f"torch/ddp:2x1 gloo   {ddp():10.0f} tokens/s")
    sys.stdout.flush()
