#!/usr/bin/env bash
# `train --model=llama3` as a user runs it: the initial weights from a safetensors file under
# Hugging Face's LlamaForCausalLM names, the data as uint16 token ids (nanoGPT's .bin), f64, 5
# AdamW steps with clipping. The losses and the saved weights must be those of the independent
# PyTorch Llama (models/llama/testdata/llama_torch_reference.safetensors, written by
# bench/peers/llama_torch_check.py) to 1e-9 relative, on one device and on dp2 x tp2 + SP; the
# saved file names the model, and `sample` rebuilds the model from it.
set -euo pipefail
train=models/train/train
sample=models/train/sample
ref=models/llama/testdata/llama_torch_reference.safetensors
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The reference's token stream as uint16 ids, and its losses (stdlib python: the file's F64s).
python3 - "$ref" "$tmp" <<'PY'
import json, struct, sys
path, out = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
h = json.loads(data[8:8 + n])
def read(name):
    a, b = h[name]["data_offsets"]
    return struct.unpack("<%dd" % ((b - a) // 8), data[8 + n + a:8 + n + b])
open(out + "/train.bin", "wb").write(struct.pack("<%dH" % len(read("train_tokens")),
                                                 *[int(t) for t in read("train_tokens")]))
open(out + "/losses.txt", "w").write("\n".join("%.17g" % v for v in read("train_losses")) + "\n")
PY

# bench/peers/llama_torch_check.py's shape and optimizer.
flags=(--model=llama3 --layers=2 --d_model=32 --heads=4 --kv_heads=2 --ffn_dim=80 --vocab=64
       --seq=16 --rope_theta=10000 --norm_eps=1e-5 --dtype=f64 --init="$ref" --data="$tmp/train.bin"
       --data_order=sequential --batch=4 --steps=5 --lr=1e-2 --beta1=0.9 --beta2=0.95 --eps=1e-8
       --weight_decay=0.1 --clip=1 --run_id=llama)

compare() {  # compare LABEL OUTPUT SAVED: the losses and the saved weights against PyTorch's
  grep '^step' <<<"$2" | awk '{print $4}' > "$tmp/got.txt"
  paste "$tmp/got.txt" "$tmp/losses.txt" | awk -v label="$1" '
    { d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > 1e-9) { print label ": step " NR-1 " loss " $1 " vs PyTorch " $2; bad = 1 } }
    END { if (NR != 5) { print label ": " NR " losses"; bad = 1 } exit bad }' || fail "$1 losses"
  python3 - "$ref" "$3" "$1" <<'PY' || fail "$1 saved weights"
import json, struct, sys
def load(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return data, n, json.loads(data[8:8 + n])
rd, rn, rh = load(sys.argv[1])
sd, sn, sh = load(sys.argv[2])
assert sh["__metadata__"]["model"] == "llama3", sh["__metadata__"]
worst, count = 0.0, 0
for name, e in rh.items():
    if not name.startswith("final."):
        continue
    hf = name[len("final."):]
    got = sh[hf]
    assert got["dtype"] == "F64" and got["shape"] == e["shape"], (hf, got, e)
    a, b = e["data_offsets"]; want = struct.unpack("<%dd" % ((b - a) // 8), rd[8 + rn + a:8 + rn + b])
    a, b = got["data_offsets"]; have = struct.unpack("<%dd" % ((b - a) // 8), sd[8 + sn + a:8 + sn + b])
    scale = max(abs(w) for w in want)
    worst = max(worst, max(abs(x - y) for x, y in zip(have, want)) / scale)
    count += 1
assert count == 21, count
print("%s: %d saved tensors, worst difference to PyTorch's final weights %.3g (relative to each tensor's largest)" % (sys.argv[3], count, worst))
sys.exit(0 if worst <= 1e-9 else 1)
PY
}

one=$("$train" "${flags[@]}" --save="$tmp/one.safetensors")
grep -q "^llama3 2 layers" <<<"$one" || fail "header: $one"
compare "one device" "$one" "$tmp/one.safetensors"
tp=$("$train" "${flags[@]}" --mesh=dp=2,tp=2 --sp --save="$tmp/tp.safetensors")
compare "dp2 x tp2 + SP" "$tp" "$tmp/tp.safetensors"

# sample rebuilds the Llama from the file's metadata, on one device and on tp=2.
s1=$("$sample" --checkpoint="$tmp/one.safetensors" --prompt=1,2,3 --tokens=4 --temperature=0 2>&1) \
  || fail "sample: $s1"
grep -q "llama3 2 layers" <<<"$s1" || fail "sample header: $s1"
s2=$("$sample" --checkpoint="$tmp/one.safetensors" --prompt=1,2,3 --tokens=4 --temperature=0 \
     --mesh=tp=2 2>&1) || fail "sample tp=2: $s2"
[ "$(tail -1 <<<"$s1")" = "$(tail -1 <<<"$s2")" ] || fail "greedy samples differ: $s1 / $s2"

# A GPT-2 run cannot resume or start from the Llama's file.
if out=$("$train" --init="$tmp/one.safetensors" --steps=1 --data="$tmp/train.bin" --vocab=64 2>&1); then
  fail "gpt2 from a llama3 file: $out"
fi
grep -q "holds a llama3 model but --model=gpt2; pass --model=llama3" <<<"$out" || fail "$out"
echo PASS
