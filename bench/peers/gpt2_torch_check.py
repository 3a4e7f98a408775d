"""Checks that a GPT-2 safetensors file written by PyTorch loads into train_gpt with the same loss.

Builds GPT-2 as Hugging Face's GPT2LMHeadModel defines it, in plain PyTorch (Conv1D weights in
[in, out] layout, c_attn packing q|k|v along its output, attention scaled by 1/sqrt(head_dim),
tanh GELU, pre-LN eps 1e-5, final ln_f, lm_head tied to wte, no dropout), initialises it with a
fixed seed (weights N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2*layers)), biases 0, LayerNorms
1/0), and writes its weights with GPT-2's names (`wte.weight`, `h.0.attn.c_attn.weight`, ...) as
safetensors from Python: torch 1.13 has no safetensors writer and Debian has no
python3-safetensors, so the format (an 8-byte little-endian header length, a JSON header of
dtype/shape/data_offsets, then the row-major little-endian bytes) is written with json + struct.

It writes a token file in nanoGPT's train.bin layout (uint16), computes the loss of step 0 (the
batch rule of the README: sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T+T+1)), takes one
AdamW step with global-norm clipping (PyTorch's AdamW, decay on >= 2-dim parameters) and computes
the loss of step 1, all in float64 from the float32 weights of the file. Then it runs
`train_gpt --init FILE --steps 2` on several meshes in f64, f32 and bf16 (mixed precision) and
compares both losses: |diff| <= 1e-5 (measured: <= 5e-10 in f64, the 10 printed digits; ~3e-7 in
f32), bf16 within loss/512 (the bound of models/train/gpt_mixed_precision_test.cc).

    bash bench/peers/gpt2_torch_check.sh     # builds train_gpt, installs python3-torch if needed
    /usr/bin/python3 bench/peers/gpt2_torch_check.py --train_gpt bazel-bin/models/train/train_gpt
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

LAYERS, D, HEADS, VOCAB, SEQ, BATCH = 2, 32, 4, 64, 16, 4
LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
TOL = 1e-5


def init_gpt2(seed):
    """GPT-2's parameters, named and shaped as Hugging Face's state dict (without lm_head)."""
    g = torch.Generator().manual_seed(seed)
    normal = lambda shape, std: torch.randn(*shape, generator=g, dtype=torch.float32) * std
    proj_std = 0.02 / math.sqrt(2 * LAYERS)
    p = {"wte.weight": normal((VOCAB, D), 0.02), "wpe.weight": normal((SEQ, D), 0.02)}
    for i in range(LAYERS):
        h = f"h.{i}."
        p[h + "ln_1.weight"], p[h + "ln_1.bias"] = torch.ones(D), torch.zeros(D)
        p[h + "attn.c_attn.weight"] = normal((D, 3 * D), 0.02)   # Conv1D: [in, out]
        p[h + "attn.c_attn.bias"] = torch.zeros(3 * D)
        p[h + "attn.c_proj.weight"] = normal((D, D), proj_std)
        p[h + "attn.c_proj.bias"] = torch.zeros(D)
        p[h + "ln_2.weight"], p[h + "ln_2.bias"] = torch.ones(D), torch.zeros(D)
        p[h + "mlp.c_fc.weight"] = normal((D, 4 * D), 0.02)
        p[h + "mlp.c_fc.bias"] = torch.zeros(4 * D)
        p[h + "mlp.c_proj.weight"] = normal((4 * D, D), proj_std)
        p[h + "mlp.c_proj.bias"] = torch.zeros(D)
    p["ln_f.weight"], p["ln_f.bias"] = torch.ones(D), torch.zeros(D)
    # Non-zero biases and LayerNorm affines, so a loader that dropped or transposed them shows.
    for name, t in p.items():
        if "bias" in name or "ln_" in name:
            t += normal(t.shape, 0.05)
    return p


def forward_loss(p, idx, targets):
    """GPT2LMHeadModel's forward (eval mode) and the mean cross-entropy over all tokens."""
    b, t = idx.shape
    hd = D // HEADS
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(t)]
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    for i in range(LAYERS):
        h = f"h.{i}."
        a = F.layer_norm(x, (D,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]   # Conv1D
        q, k, v = (z.view(b, t, HEADS, hd).transpose(1, 2) for z in qkv.split(D, dim=2))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        s = s.masked_fill(mask, float("-inf"))
        o = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, D)
        x = x + o @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (D,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (D,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = x @ p["wte.weight"].t()   # lm_head tied to wte
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def write_safetensors(path, tensors, metadata):
    """The safetensors format by hand: u64 LE header size, JSON header, then the raw bytes."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    codes = {torch.float32: ("F32", "<f"), torch.float64: ("F64", "<d")}
    for name, t in tensors.items():
        dtype, fmt = codes[t.dtype]
        flat = t.contiguous().reshape(-1).tolist()
        blob = struct.pack(f"{fmt[0]}{len(flat)}{fmt[1]}", *flat)
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)   # the data starts 8-byte aligned, as Hugging Face writes
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(path + ".tmp", path)


def token_stream(n, seed):
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & ((1 << 64) - 1)
        out.append((x >> 33) % VOCAB)
    return out


def batch_at(data, step):
    rows = []
    for b in range(BATCH):
        start = ((step * BATCH + b) * SEQ) % len(data)
        rows.append([data[(start + i) % len(data)] for i in range(SEQ + 1)])
    x = torch.tensor(rows, dtype=torch.long)
    return x[:, :-1], x[:, 1:]


def torch_losses(params32, data):
    """Losses of steps 0 and 1 (one AdamW + clipping step between), in float64."""
    p = {k: v.double().clone().requires_grad_(True) for k, v in params32.items()}
    decay = [t for t in p.values() if t.dim() >= 2]
    no_decay = [t for t in p.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(2):
        loss = forward_loss(p, *batch_at(data, step))
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), CLIP)
        opt.step()
    return losses


def run_train_gpt(binary, ckpt, data_path, dtype, mesh_flags):
    cmd = [binary, f"--init={ckpt}", f"--data={data_path}", "--steps=2", f"--dtype={dtype}",
           f"--layers={LAYERS}", f"--d_model={D}", f"--heads={HEADS}", f"--vocab={VOCAB}",
           f"--seq={SEQ}", f"--batch={BATCH}", f"--lr={LR}", f"--beta1={BETAS[0]}",
           "--data_order=sequential",
           f"--beta2={BETAS[1]}", f"--eps={EPS}", f"--weight_decay={WD}", f"--clip={CLIP}"]
    out = subprocess.run(cmd + mesh_flags, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"train_gpt failed ({' '.join(cmd + mesh_flags)}):\n{out.stderr}")
    return [float(v) for v in re.findall(r"^step \d+ loss (\S+)", out.stdout, re.M)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train_gpt", default="bazel-bin/models/train/train_gpt")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.set_num_threads(1)
    params = init_gpt2(args.seed)
    data = token_stream(4096, args.seed)
    want = torch_losses(params, data)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, data_path = os.path.join(tmp, "gpt2.safetensors"), os.path.join(tmp, "train.bin")
        write_safetensors(ckpt, params, {"format": "pt"})
        with open(data_path, "wb") as f:
            f.write(struct.pack(f"<{len(data)}H", *data))
        print(f"PyTorch (float64 from the file's float32 weights): step 0 loss {want[0]:.10g}, "
              f"step 1 loss {want[1]:.10g}")
        for dtype in ("f64", "f32", "bf16"):
            # bf16 mixed precision: within 2^-9 of the loss (models/train/gpt_mixed_precision_test.cc).
            tol = TOL if dtype != "bf16" else want[0] / 512
            for mesh in ([], ["--mesh=dp=2"], ["--mesh=dp_shard=2,tp=2", "--sp"],
                         ["--mesh=tp=2"], ["--mesh=cp=2,tp=2"]):
                got = run_train_gpt(args.train_gpt, ckpt, data_path, dtype, mesh)
                diffs = [abs(g - w) for g, w in zip(got, want)]
                good = len(got) == 2 and max(diffs) <= tol
                ok &= good
                print(f"train_gpt --dtype={dtype} {' '.join(mesh) or '(1 device)':28s} "
                      f"step 0 {got[0]:.10g} (diff {diffs[0]:.1e}), step 1 {got[1]:.10g} "
                      f"(diff {diffs[1]:.1e}) {'ok' if good else 'FAIL'}")
    print("PASS" if ok else f"FAIL: a loss differs from PyTorch's by more than {TOL} "
          "(bf16: loss/512)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
