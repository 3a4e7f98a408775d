"""The peer of //bench:llama_bench: the same Llama 3 training step in PyTorch eager on the CPU.

Llama as Hugging Face's LlamaForCausalLM defines it (RMSNorm eps 1e-5, rotary positions theta
500000 with rotate_half, grouped-query attention with repeat_kv, SwiGLU, no biases, untied
lm_head, mean cross-entropy), 4 layers, d_model 256, 8 heads, 4 kv heads, ffn 768, vocab 256,
seq 256, batch 8, f32; AdamW (lr 1e-3, betas 0.9/0.95, wd 0.1 on >= 2-dim tensors) with
global-norm clipping 1.0; the batch rule of the C++ benchmark (sample b of step s is tokens
[(s*B+b)*T, +T+1) of the same LCG token stream). Attention is written out (scores, mask,
softmax) as in modeling_llama's eager path (Debian's torch 1.13 has no
scaled_dot_product_attention). Prints tokens/s and CPU ms per step with 1 thread (the C++ side's
single rank).

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/llama_torch.py
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS, D, HEADS, KV_HEADS, FFN, VOCAB, SEQ, BATCH = 4, 256, 8, 4, 768, 256, 256, 8
THETA, EPS = 500000.0, 1e-5
HD = D // HEADS
WARMUP, MEASURED = 1, 4


def tokens():
    x, out, mask = 7, [], (1 << 64) - 1
    for _ in range(1 << 16):
        x = (x * 6364136223846793005 + 1442695040888963407) & mask
        out.append((x >> 33) % VOCAB)
    return torch.tensor(out, dtype=torch.long)


def batch_at(data, step):
    n = data.numel()
    rows = [data[(torch.arange(SEQ + 1) + (step * BATCH + b) * SEQ) % n] for b in range(BATCH)]
    x = torch.stack(rows)
    return x[:, :-1], x[:, 1:]


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rotate_half(x):
    return torch.cat((-x[..., HD // 2:], x[..., : HD // 2]), dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.q_proj = nn.Linear(D, HEADS * HD, bias=False)
        self.k_proj = nn.Linear(D, KV_HEADS * HD, bias=False)
        self.v_proj = nn.Linear(D, KV_HEADS * HD, bias=False)
        self.o_proj = nn.Linear(HEADS * HD, D, bias=False)
        self.gate_proj = nn.Linear(D, FFN, bias=False)
        self.up_proj = nn.Linear(D, FFN, bias=False)
        self.down_proj = nn.Linear(FFN, D, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, HEADS, HD).transpose(1, 2)
        k = self.k_proj(h).view(b, t, KV_HEADS, HD).transpose(1, 2)
        v = self.v_proj(h).view(b, t, KV_HEADS, HD).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = HEADS // KV_HEADS
        k = k[:, :, None].expand(b, KV_HEADS, rep, t, HD).reshape(b, HEADS, t, HD)
        v = v[:, :, None].expand(b, KV_HEADS, rep, t, HD).reshape(b, HEADS, t, HD)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        o = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + self.o_proj(o.transpose(1, 2).reshape(b, t, D))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm()
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def main():
    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = Llama()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    data, times, cpu = tokens(), [], []
    for step in range(WARMUP + MEASURED):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = batch_at(data, step)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    rate = BATCH * SEQ * len(times) / sum(times)
    print(f"PyTorch {torch.__version__} eager, Llama {LAYERS}x{D}, "
          f"{HEADS}/{KV_HEADS} heads, ffn {FFN}, seq {SEQ}, vocab {VOCAB}, batch {BATCH}, f32")
    print(f"torch/threads:1  {rate:10.0f} tokens/s  step {1e3 * sum(times) / len(times):.1f} ms  "
          f"cpu {1e3 * sum(cpu) / len(cpu):.1f} ms/step  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
