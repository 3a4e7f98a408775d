"""An independent Llama 3 reference in plain PyTorch (f64): the loss and every gradient.

Builds the model as Hugging Face's LlamaForCausalLM defines it (modeling_llama.py), written out
here without transformers: RMSNorm w * x * rsqrt(mean(x^2) + eps); rotary embedding with
inv_freq = theta^(-2i/hd), cos/sin over cat(freqs, freqs) and rotate_half(x) = cat(-x2, x1);
grouped-query attention with repeat_kv (query head h reads kv head h // (heads / kv_heads)),
causal, scaled by 1/sqrt(hd); SwiGLU down(silu(gate(x)) * up(x)); no biases; untied lm_head;
mean cross-entropy over every token. nn.Linear weights are [out, in] (y = x @ W^T).

It draws the weights from a fixed torch seed (RMSNorm weights 1 + 0.1 N(0,1) so a dropped or
misplaced norm weight shows), a batch of tokens, computes loss and gradients in float64 and
writes them all to one safetensors file (written with json + struct: Debian has no
python3-safetensors): the parameters under Hugging Face's names, `grad.<name>` for each
gradient, `tokens` [batch, seq+1] (as F64) and `loss` [1]; and the losses of 5 AdamW steps with
clipping from the same weights (`train_losses` [5]) over a token stream (`train_tokens`), and the
weights those steps end with (`final.<name>`).
models/llama/llama_model_test.cc and llama_train_test.cc read the committed file
(models/llama/testdata/llama_torch_reference.safetensors), run shardmap's LlamaLayout (and the
trainer) on the same weights on several meshes and compare to 1e-9 relative.

    /usr/bin/python3 bench/peers/llama_torch_check.py [--out FILE]
    bash bench/peers/llama_torch_check.sh     # installs python3-torch if needed, then the test
"""
import argparse
import json
import math
import struct

import torch
import torch.nn.functional as F

# Must match kRef in models/llama/llama_model_test.cc.
LAYERS, D, HEADS, KV_HEADS, FFN, VOCAB, SEQ, BATCH = 2, 32, 4, 2, 80, 64, 16, 4
THETA, EPS = 10000.0, 1e-5
HD = D // HEADS
# Training: 5 steps of PyTorch's AdamW (decay on >= 2-dim tensors) with global-norm clipping.
STEPS, LR, BETAS, ADAM_EPS, WD, CLIP, STREAM = 5, 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0, 400


def init_params(seed):
    g = torch.Generator().manual_seed(seed)
    normal = lambda shape, std: torch.randn(*shape, generator=g, dtype=torch.float64) * std
    norm_w = lambda: 1.0 + 0.1 * torch.randn(D, generator=g, dtype=torch.float64)
    p = {"model.embed_tokens.weight": normal((VOCAB, D), 0.5)}
    for i in range(LAYERS):
        l = f"model.layers.{i}."
        p[l + "input_layernorm.weight"] = norm_w()
        p[l + "self_attn.q_proj.weight"] = normal((HEADS * HD, D), 0.2)
        p[l + "self_attn.k_proj.weight"] = normal((KV_HEADS * HD, D), 0.2)
        p[l + "self_attn.v_proj.weight"] = normal((KV_HEADS * HD, D), 0.2)
        p[l + "self_attn.o_proj.weight"] = normal((D, HEADS * HD), 0.1)
        p[l + "post_attention_layernorm.weight"] = norm_w()
        p[l + "mlp.gate_proj.weight"] = normal((FFN, D), 0.2)
        p[l + "mlp.up_proj.weight"] = normal((FFN, D), 0.2)
        p[l + "mlp.down_proj.weight"] = normal((D, FFN), 0.1)
    p["model.norm.weight"] = norm_w()
    p["lm_head.weight"] = normal((VOCAB, D), 0.2)
    return p


def rms_norm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(seq):
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()  # [seq, hd]


def repeat_kv(x, rep):  # [b, kv, t, hd] -> [b, kv * rep, t, hd]
    b, kv, t, hd = x.shape
    return x[:, :, None].expand(b, kv, rep, t, hd).reshape(b, kv * rep, t, hd)


def forward(p, ids, targets):
    b, t = ids.shape
    x = p["model.embed_tokens.weight"][ids]
    cos, sin = rope(t)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(LAYERS):
        l = f"model.layers.{i}."
        h = rms_norm(x, p[l + "input_layernorm.weight"])
        q = (h @ p[l + "self_attn.q_proj.weight"].T).view(b, t, HEADS, HD).transpose(1, 2)
        k = (h @ p[l + "self_attn.k_proj.weight"].T).view(b, t, KV_HEADS, HD).transpose(1, 2)
        v = (h @ p[l + "self_attn.v_proj.weight"].T).view(b, t, KV_HEADS, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v, HEADS // KV_HEADS)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
        x = x + a.transpose(1, 2).reshape(b, t, D) @ p[l + "self_attn.o_proj.weight"].T
        h = rms_norm(x, p[l + "post_attention_layernorm.weight"])
        m = F.silu(h @ p[l + "mlp.gate_proj.weight"].T) * (h @ p[l + "mlp.up_proj.weight"].T)
        x = x + m @ p[l + "mlp.down_proj.weight"].T
    logits = rms_norm(x, p["model.norm.weight"]) @ p["lm_head.weight"].T
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def train(init, stream):
    """Losses of STEPS steps; sample b of step s is stream[(s*B+b)*T : +T+1], wrapping."""
    p = {k: v.detach().clone().requires_grad_() for k, v in init.items()}
    decay = [v for v in p.values() if v.dim() >= 2]
    no_decay = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=ADAM_EPS)
    losses, norms = [], []
    n = stream.numel()
    for step in range(STEPS):
        rows = [stream[(torch.arange(SEQ + 1) + (step * BATCH + b) * SEQ) % n]
                for b in range(BATCH)]
        x = torch.stack(rows)
        loss = forward(p, x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(p.values()), CLIP)))
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float64), norms, p


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().to(torch.float64).numpy().tobytes()
        header[name] = {"dtype": "F64", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/llama/testdata/llama_torch_reference.safetensors")
    args = ap.parse_args()
    p = {k: v.requires_grad_() for k, v in init_params(44).items()}
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    loss = forward(p, tokens[:, :-1], tokens[:, 1:])
    grads = torch.autograd.grad(loss, list(p.values()))
    out = dict(p)
    out.update({"grad." + k: gr for k, gr in zip(p, grads)})
    out["tokens"] = tokens.to(torch.float64)
    out["loss"] = loss.detach().reshape(1)
    stream = torch.randint(0, VOCAB, (STREAM,), generator=g)
    losses, norms, final = train({k: v.detach() for k, v in p.items()}, stream)
    out["train_tokens"] = stream.to(torch.float64)
    out["train_losses"] = losses
    out.update({"final." + k: v for k, v in final.items()})  # the weights after the 5 steps
    write_safetensors(args.out, out)
    print(f"torch {torch.__version__}: loss {loss.item():.17g}, |grad| "
          f"{math.sqrt(sum(float((gr * gr).sum()) for gr in grads)):.17g} -> {args.out}")
    print("training losses " + " ".join(f"{v:.12f}" for v in losses.tolist()) +
          ", grad norms " + " ".join(f"{v:.4f}" for v in norms))


if __name__ == "__main__":
    main()
