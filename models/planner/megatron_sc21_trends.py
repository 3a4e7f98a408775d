#!/usr/bin/env python3
"""The trends of Megatron-LM SC21 (Narayanan et al. 2021) as plan_gpt predicts them.

Each figure's settings from the paper's own scripts (NVIDIA/Megatron-LM examples/sc21/
run_figure_{12,13,16}.sh): GPT shape, GPUs, global batch, microbatch size, full recomputation,
Megatron's local DDP (gradients all-reduced after the pipeline flush: --overlap=false), on the
a100_node profile with materialised attention. Prints markdown tables of predicted TFLOP/s per
GPU, counted as the paper counts them (its equation 3, recomputation included).

  models/planner/megatron_sc21_trends.py [PLAN_GPT]
"""
import re
import subprocess
import sys

PLAN_GPT = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin/models/planner/plan_gpt"
S, V = 2048, 51200


def flops(batch, layers, hidden):
    return 96 * batch * S * layers * hidden**2 * (1 + S / (6 * hidden) + V / (16 * layers * hidden))


def predict(layers, hidden, heads, gpus, batch, specs):
    """Predicted step seconds (and whether it fits) for each mesh spec."""
    out = subprocess.run(
        [PLAN_GPT, f"--layers={layers}", f"--d_model={hidden}", f"--heads={heads}",
         f"--vocab={V}", f"--seq={S}", f"--batch={batch}", f"--gpus={gpus}",
         "--profile=a100_node", "--overlap=false", "--refused=true", "--top=0",
         "--attention=materialised",
         "--mesh=" + ";".join(specs)],
        capture_output=True, text=True).stdout
    result = {}
    for line in out.splitlines():
        m = re.match(r"\s+(\d+|OOM)\s+(.+?)\s+([\d.]+) (s|ms)\s", line)
        if m:
            secs = float(m.group(3)) / (1000 if m.group(4) == "ms" else 1)
            result[m.group(2).strip()] = (secs, m.group(1) != "OOM")
    for spec in specs:
        if spec not in result:
            reason = [l for l in out.splitlines() if spec.split()[0] in l]
            result[spec] = (None, reason[-1].strip() if reason else "refused")
    return result


def table(title, header, rows):
    print(f"**{title}**\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print()


def cell(batch, layers, hidden, gpus, res):
    secs, fits = res
    if secs is None:
        return f"refused ({fits})"
    return f"{flops(batch, layers, hidden) / (secs * gpus) / 1e12:.0f}" + ("" if fits else " (OOM)")


def figure13():
    # 162.2B (32 layers, hidden 20480, 128 heads), 64 GPUs, (t, p) with t * p = 64, mbs 1.
    rows = []
    for batch in (32, 128):
        specs = {}
        for p in (2, 4, 8, 16, 32):
            t = 64 // p
            specs[(p, t)] = f"pp={p},tp={t} 1f1b/m{batch} rc=full"
        res = predict(32, 20480, 128, 64, batch, list(specs.values()))
        rows.append([batch] + [cell(batch, 32, 20480, 64, res[s]) for s in specs.values()])
    table("Figure 13: tensor vs pipeline parallelism (162.2B, 64 GPUs), predicted TFLOP/s per GPU",
          ["batch", "(p,t)=(2,32)", "(4,16)", "(8,8)", "(16,4)", "(32,2)"], rows)


def figure16():
    # 91B (32 layers, hidden 15360, 128 heads), (t, p) = (8, 8), 64 GPUs, microbatch size 1-8.
    rows = []
    for batch in (128, 512):
        specs = [f"pp=8,tp=8 1f1b/m{batch // mbs} rc=full" for mbs in (1, 2, 4, 8)]
        res = predict(32, 15360, 128, 64, batch, specs)
        rows.append([batch] + [cell(batch, 32, 15360, 64, res[s]) for s in specs])
    table("Figure 16: microbatch size (91B, (t,p)=(8,8), 64 GPUs), predicted TFLOP/s per GPU",
          ["batch", "mbs 1", "mbs 2", "mbs 4", "mbs 8"], rows)


def figure12():
    # GPT-3 175B (96 layers, hidden 12288, 96 heads), t = 8, p = 12, 96 GPUs, mbs 1; interleaved
    # with 2 layers per virtual stage (v = 4).
    rows = []
    for batch in (12, 24, 36, 48, 60):
        specs = [f"pp=12,tp=8 1f1b/m{batch} rc=full",
                 f"pp=12,tp=8 interleaved_1f1b/m{batch}/v4 rc=full"]
        res = predict(96, 12288, 96, 96, batch, specs)
        rows.append([batch] + [cell(batch, 96, 12288, 96, res[s]) for s in specs])
    table("Figure 12: interleaved vs non-interleaved (175B, (t,p)=(8,12), 96 GPUs), predicted "
          "TFLOP/s per GPU", ["batch", "1F1B", "interleaved (v=4)"], rows)


if __name__ == "__main__":
    figure13()
    figure16()
    figure12()
