#!/usr/bin/env bash
# The GPT-2 bitwise probe: trains the same small GPT-2 on ten meshes (every parallelism, the
# overlapped and recomputed steps, MoE, the pipeline schedules), saves each run's parameters and
# AdamW moments, and prints one sha256 per checkpoint over its tensors (names, dtypes, shapes and
# bytes; the metadata names paths). Run it with the trainer before and after a
# structural change: the two lists must be identical. The hashes depend on the CPU (OpenBLAS
# and the vector kernels pick their code by instruction set), so compare two builds on one
# machine; bench/model_bitwise_probe_gpt2.txt is one machine's list, a record, not a reference.
#
#   bash tools/model_bitwise_probe.sh bazel-bin/models/train/train_gpt /tmp/probe_before > before.txt
set -euo pipefail
bin=$1
out=$2
mkdir -p "$out"
# A fixed text, made here, so that no edit to the repository changes the probe's data.
text=$out/probe_text.txt
awk 'BEGIN { for (i = 0; i < 400; i++) printf "%d: the quick brown fox jumps over the lazy dog %d times.\n", i, (i * 7919) % 1000 }' > "$text"
common=(--text="$text" --steps=3 --batch=8 --layers=4 --d_model=32 --heads=4 --seq=16 --vocab=256
        --lr=0.003 --clip=1 --run_id=probe --log_every=100)
runs=(
  "single|--mesh=dp=1"
  "dp2|--mesh=dp=2"
  "fsdp2|--mesh=dp_shard=2 --overlap=on"
  "hsdp|--mesh=dp_replicate=2,dp_shard=2"
  "tp2sp|--mesh=tp=2 --sp"
  "dp2tp2sp_f64|--mesh=dp=2,tp=2 --sp --dtype=f64"
  "cp2|--mesh=cp=2"
  "pp2_1f1b|--mesh=pp=2,dp=2 --microbatches=4"
  "pp2_interleaved|--mesh=pp=2 --microbatches=4 --schedule=interleaved_1f1b --virtual_stages=2"
  "ep2_moe_recompute|--mesh=ep=2 --experts=2 --recompute=full"
)
for r in "${runs[@]}"; do
  name=${r%%|*}
  flags=${r#*|}
  # shellcheck disable=SC2086
  "$bin" "${common[@]}" $flags --save="$out/$name.safetensors" > "$out/$name.log" 2>&1 || {
    echo "$name: the run failed (see $out/$name.log)" >&2
    exit 1
  }
  # The tensors (names, dtypes, shapes, bytes), not the metadata: it names paths and settings.
  echo "$name $(python3 - "$out/$name.safetensors" <<'PY'
import hashlib, json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
h = hashlib.sha256()
for name in sorted(k for k in header if k != "__metadata__"):
    e = header[name]
    begin, end = e["data_offsets"]
    h.update(json.dumps([name, e["dtype"], e["shape"]]).encode())
    h.update(data[8 + n + begin:8 + n + end])
print(h.hexdigest(), len(header) - 1, "tensors")
PY
)"
done
