"""One table of the GPT-2 step on a GPU: gpt_bench --device=cuda (ours) against
bench/peers/gpt_torch_cuda.py (PyTorch eager and torch.compile), run in the same GPU session.

    python3 bench/peers/gpt_gpu_table.py OURS.json TORCH.jsonl > gpt_gpu_table.md

OURS.json: Google Benchmark JSON of gpt_bench (rows gpt_step/cuda/<dtype>/gpt2_124m/mesh:...,
counters tokens_per_s, step_ms, mfu, peak_mem_MiB). TORCH.jsonl: one object per mode. Per row:
tokens/s, step ms, MFU, peak memory, and our speed over PyTorch eager's and torch.compile's
(> 1: we are faster), our peak memory over eager's (< 1: we use less).
"""
import json
import sys


def load_ours(path):
    rows = []
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # A run cut off by its time limit: keep the benchmarks written so far.
        cut = text.rfind("},")
        data = json.loads(text[:cut + 1] + "]}") if cut > 0 else {"benchmarks": []}
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        rows.append({"name": "ours " + b["name"].split("/", 1)[1],
                     "tokens_per_s": b.get("tokens_per_s"), "step_ms": b.get("step_ms"),
                     "mfu": b.get("mfu"),
                     "peak_gib": b["peak_mem_MiB"] / 1024 if "peak_mem_MiB" in b else None})
    return rows


def load_torch(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                rows.append({"name": f"torch {r['mode']} ({r['dtype']})", "mode": r["mode"],
                             "tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"],
                             "mfu": r["mfu"], "peak_gib": r["peak_bytes"] / 2**30,
                             "card": r.get("card"), "torch": r.get("torch")})
    return rows


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours, torch_rows = load_ours(sys.argv[1]), load_torch(sys.argv[2])
    eager = next((r for r in torch_rows if r["mode"] == "eager"), None)
    comp = next((r for r in torch_rows if r["mode"] == "compile"), None)
    card = torch_rows[0]["card"] if torch_rows else "?"
    tv = torch_rows[0]["torch"] if torch_rows else "?"
    print(f"GPT-2 step on {card} (PyTorch {tv}); speed ratios > 1: ours faster\n")
    print("| run | tokens/s | step ms | MFU | peak GiB | ÷ eager speed | ÷ compile speed | "
          "peak ÷ eager |")
    print("|---|---|---|---|---|---|---|---|")
    for r in torch_rows + ours:
        ours_row = r["name"].startswith("ours")
        def ratio(ref, key):
            if not ours_row or ref is None or r[key] is None or not ref[key]:
                return "-"
            return f"{(r[key] / ref[key]):.2f}"
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        print(f"| {r['name']} | {fmt(r['tokens_per_s'], '.0f')} | {fmt(r['step_ms'], '.2f')} | "
              f"{mfu} | {fmt(r['peak_gib'], '.2f')} | {ratio(eager, 'tokens_per_s')} | "
              f"{ratio(comp, 'tokens_per_s')} | {ratio(eager, 'peak_gib')} |")
    if not ours:
        print("\n(no gpt_bench rows: see gpt_bench.txt)")
    if not torch_rows:
        print("\n(no PyTorch rows: see gpt_torch_cuda.txt)")


if __name__ == "__main__":
    main()
