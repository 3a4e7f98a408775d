#!/usr/bin/env bash
# PyTorch's torch.distributed all_reduce over Gloo (the same libgloo: Debian's libtorch links
# libgloo0) beside ours from //bench:collectives_bench (gloo and in_process backends), on the same
# sizes and world sizes, interleaved for --rounds rounds (best time per config: the machine may
# be shared). Installs Debian's python3-torch when missing; runs with /usr/bin/python3.
#
#   bench/peers/torch_collectives.sh               # worlds 2 and 4, 3 rounds
#   ROUNDS=1 WORLDS=2 MIN_BYTES=1048576 MAX_BYTES=16777216 bench/peers/torch_collectives.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${ROUNDS:-3}"
WORLDS="${WORLDS:-2,4}"
MIN_BYTES="${MIN_BYTES:-4096}"
MAX_BYTES="${MAX_BYTES:-67108864}"

if ! /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get install -y -q --no-install-recommends python3-torch
fi

bazel build -c opt --config=opt //bench:collectives_bench
bench="$(bazel info -c opt --config=opt bazel-bin)/bench/collectives_bench"
out="$(mktemp -d)"
worlds_re="$(echo "$WORLDS" | tr ',' '|')"
sizes_re=""
for ((b = 4096; b <= 67108864; b *= 4)); do
  if ((b >= MIN_BYTES && b <= MAX_BYTES)); then sizes_re="${sizes_re:+$sizes_re|}$b"; fi
done
filter="all_reduce/backend:(gloo|in_process)/world:(${worlds_re})/bytes:(${sizes_re})/"
ours=() torch=()
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round: ours"
  "$bench" --benchmark_filter="$filter" --benchmark_out="$out/ours_$round.json" \
    --benchmark_out_format=json >/dev/null
  ours+=("$out/ours_$round.json")
  echo "== round $round: torch"
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/peers/torch_collectives.py --worlds="$WORLDS" \
    --min_bytes="$MIN_BYTES" --max_bytes="$MAX_BYTES" --json="$out/torch_$round.json"
  torch+=("$out/torch_$round.json")
done
/usr/bin/python3 bench/peers/torch_collectives.py --report \
  --ours="$(IFS=,; echo "${ours[*]}")" --torch="$(IFS=,; echo "${torch[*]}")"
