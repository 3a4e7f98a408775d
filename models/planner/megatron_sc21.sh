#!/bin/bash
# Holds plan_gpt against Megatron-LM's SC21 Table 1 (Narayanan et al. 2021, arXiv 2104.04473):
# each row's own configuration, as the paper's scripts ran it (NVIDIA/Megatron-LM
# examples/sc21/run_table_1.sh: tensor / pipeline sizes, microbatch size, global batch, full
# recomputation, the interleaved schedule's layers per virtual stage), on the a100_node profile
# with materialised attention (--attention=materialised: no FlashAttention in 2021) and
# plan_gpt's defaults otherwise (issue 47: no setting a user would not find). Prints a markdown
# table of predicted against published TFLOP/s per GPU, counted as the paper counts them
# (its equation 3, which includes the recomputed forward).
#   models/planner/megatron_sc21.sh [PLAN_GPT] [extra plan_gpt flags]
# MODE=rank: for each row instead, the paper's configuration against the best of two searches on
# its GPUs: the restricted one (what the paper could run in 2021: DDP only, full recomputation,
# no SP, 1F1B or interleaved; --overlap as the table prices the paper's run) and the whole one
# (every mesh, --overlap=true, the framework's trainer); the paper's configuration priced under
# each search's --overlap. SEARCH_LIMITS bounds both searches (default below; microbatches pp x
# 1, 4 and the paper's own count over pp; 2 and the paper's chunks per stage); ONLY_ROWS picks rows
# (e.g. ONLY_ROWS="76.1B 1008B"); SEARCHES=restricted skips the whole search.
#   MODE=rank ONLY_ROWS="18.4B" models/planner/megatron_sc21.sh bazel-bin/models/planner/plan_gpt
set -euo pipefail
PLAN_GPT=${1:-bazel-bin/models/planner/plan_gpt}
shift || true
# name layers hidden heads tp pp gpus batch microbatch_size layers_per_virtual_stage tflops
ROWS="1.7B 24 2304 24 1 1 32 512 16 0 137
3.6B 30 3072 32 2 1 64 512 16 0 138
7.5B 36 4096 32 4 1 128 512 16 0 142
18.4B 40 6144 48 8 1 256 1024 8 0 135
39.1B 48 8192 64 8 2 512 1536 4 0 138
76.1B 60 10240 80 8 4 1024 1792 2 5 140
145.6B 80 12288 96 8 8 1536 2304 2 5 148
310.1B 96 16384 128 8 16 1920 2160 1 3 155
529.6B 105 20480 128 8 35 2520 2520 1 1 163
1008B 128 25600 160 8 64 3072 3072 1 0 163"
MODE=${MODE:-table}
SEARCH_LIMITS=${SEARCH_LIMITS:---max_cp=1 --virtual_stages=2}
# "rank mesh step_s" of a plan's first row (1 or OOM), "- - -" without one.
first_row() {
  python3 -c '
import sys
units = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
table = False
for line in sys.stdin:
    t = line.split()
    table = table or (len(t) > 1 and t[0] == "rank" and t[1] == "mesh")
    if not table or len(t) < 4 or t[0] not in ("1", "OOM"):
        continue
    for i in range(2, len(t) - 1):
        if t[i + 1] in units:
            try:
                v = float(t[i]) * units[t[i + 1]]
            except ValueError:
                continue
            print(t[0], " ".join(t[1:i]).replace(" (does not fit)", ""), v)
            sys.exit(0)
print("- - -")'
}
if [ "$MODE" = rank ]; then
  echo "| model (GPUs) | paper's configuration | best of the restricted search | paper / best | best of the whole search | paper / best | search seconds (restricted, whole) |"
  echo "|---|---|---|---|---|---|---|"
else
  echo "| model | t | p | d | batch | mbs | schedule | paper TFLOP/s | predicted | error | GiB/GPU | bubble |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
fi
while read -r name l h a t p n B mbs lpv paper; do
  if [ -n "${ONLY_ROWS:-}" ] && [[ " $ONLY_ROWS " != *" $name "* ]]; then continue; fi
  d=$((n / t / p))
  local_batch=$((B / d))
  mesh="dp=$d"
  [ "$t" -gt 1 ] && mesh="$mesh,tp=$t"
  if [ "$p" -gt 1 ]; then
    mesh="pp=$p,$mesh"
    m=$((local_batch / mbs))
    if [ "$lpv" -gt 0 ]; then
      v=$((l / p / lpv))
      sched="interleaved_1f1b/m$m/v$v"
    else
      sched="1f1b/m$m"
    fi
    spec="$mesh $sched rc=full"
    overlap=false   # Megatron's local DDP: gradients all-reduced after the pipeline flush
  else
    ga=$((local_batch / mbs))
    sched="ga$ga"
    spec="$mesh ga$ga rc=full"
    overlap=true    # torch DDP: bucketed all-reduce during the backward
  fi
  model=(--layers="$l" --d_model="$h" --heads="$a" --vocab=51200 --seq=2048 --batch="$B"
         --gpus="$n" --profile=a100_node --refused=false --attention=materialised)
  if [ "$MODE" = rank ]; then
    paper_restricted=$("$PLAN_GPT" "${model[@]}" --mesh="$spec" --overlap=$overlap --top=1 "$@" \
      2>/dev/null | first_row)
    paper_whole=$("$PLAN_GPT" "${model[@]}" --mesh="$spec" --overlap=true --top=1 "$@" \
      2>/dev/null | first_row)
    # The searches reach the paper's pipeline depth (and no further than 2x it), and its
    # microbatches per stage (microbatch size 1-2 on the deep pipelines) beside 1 and 4.
    max_pp=$((p > 8 ? 2 * p : 8))
    factors=1,4
    if [ "$p" -gt 1 ]; then
      f=$((local_batch / mbs / p))
      [ "$f" != 1 ] && [ "$f" != 4 ] && factors="$factors,$f"
    fi
    limits="$SEARCH_LIMITS --microbatch_factors=$factors"
    # And its chunks per stage (interleaved_1f1b/vV) beside 2.
    if [ "$lpv" -gt 0 ] && [ $((l / p / lpv)) != 2 ]; then
      limits="$limits --virtual_stages=2,$((l / p / lpv))"
    fi
    t0=$(date +%s.%N)
    restricted=$("$PLAN_GPT" "${model[@]}" $limits --max_pp=$max_pp --overlap=$overlap \
      --data_parallel=dp --recompute=full --schedules=1f1b,interleaved_1f1b --sp=off --top=1 \
      "$@" 2>/dev/null | first_row)
    t1=$(date +%s.%N)
    whole="- - -"
    if [ "${SEARCHES:-both}" != restricted ]; then
      whole=$("$PLAN_GPT" "${model[@]}" $limits --max_pp=$max_pp --top=1 "$@" 2>/dev/null |
        first_row)
    fi
    t2=$(date +%s.%N)
    python3 - "$name" "$n" "$paper_restricted" "$paper_whole" "$restricted" "$whole" \
      "$t0" "$t1" "$t2" <<'PY'
import sys
name, n, pr, pw, r, w, t0, t1, t2 = sys.argv[1:]
def parse(x):
    t = x.split()
    return t[0], " ".join(t[1:-1]), (float(t[-1]) if t[-1] != "-" else None)
def cell(x):
    rank, mesh, step = parse(x)
    if step is None:
        return "(not run)"
    return f"`{mesh}` {step:.4g} s" + (" (does not fit)" if rank == "OOM" else "")
def ratio(p, b):
    _, _, ps = parse(p)
    _, _, bs = parse(b)
    return f"{ps / bs:.2f}" if ps and bs else ""
over = parse(pw)[2]
over = f"{over:.4g} s" if over else "-"
print(f"| {name} ({n}) | {cell(pr)}; overlapped: {over} | {cell(r)} | {ratio(pr, r)} | "
      f"{cell(w)} | {ratio(pw, w)} | {float(t1) - float(t0):.0f}, {float(t2) - float(t1):.0f} |")
PY
    continue
  fi
  out=$("$PLAN_GPT" "${model[@]}" --mesh="$spec" --top=1 "$@" 2>/dev/null)
  row=$(echo "$out" | grep -E "^ +(1|OOM) ")
  step=$(echo "$row" | awk '{for (i = 1; i <= NF; ++i) if ($(i+1) == "s" || $(i+1) == "ms") { print ($(i+1) == "ms" ? $i / 1000 : $i); exit } }')
  gib=$(echo "$row" | awk '{for (i = 1; i <= NF; ++i) if ($i ~ /%$/ && $(i+1) ~ /^[0-9.]+$/) { print $(i+1); exit } }')
  bubble=$(echo "$row" | awk '{print $NF}')
  python3 - "$name" "$t" "$p" "$d" "$B" "$mbs" "$sched" "$paper" "$step" "$gib" "$bubble" "$l" "$h" \
    "$n" "$(echo "$row" | awk '{print $1}')" <<'PY'
import sys
name, t, p, d, B, mbs, sched, paper, step, gib, bubble, l, h, n, rank = sys.argv[1:]
B, l, h, n, step, paper = int(B), int(l), int(h), int(n), float(step), float(paper)
s, V = 2048, 51200
F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
pred = F / (step * n) / 1e12
fit = "" if rank != "OOM" else " (OOM)"
print(f"| {name} | {t} | {p} | {d} | {B} | {mbs} | {sched} | {paper:.0f} | {pred:.0f}{fit} | "
      f"{100 * (pred / paper - 1):+.1f}% | {gib} | {bubble} |")
PY
done <<< "$ROWS"
