"""Writes this folder's FORMAT SAMPLE files (synthetic numbers, NOT measurements) for
tools/bench_report_gpu_test.sh, in the formats a GPU run writes:
  tp_gpu_profile.txt  as tp_bench --device=cuda --profile_out (bench/tp_model_gpu.h)
  tp_bench_cuda.json  as tp_bench --device=cuda --benchmark_format=json (a few rows)
  machine.txt         as tools/bench_report.sh --gpu collects it on the GPU machine
Synthetic: GEMM = FLOPs / 400 TFLOP/s + 8 us; collectives 10 us + t * bytes / 1 TB/s; layer rows
1.15 x the model's prediction.   /usr/bin/python3 make_sample.py
"""
import json

T, d, s, hd = 256, 512, 128, 64
f = 4 * d
heads = d // hd


def gemms(layer, t, fb):
    col = (1, T, d, f // t)
    row = (1, T, f // t, d)
    att = [(1, T, d, 3 * d // t), ((T // s) * (heads // t), s, hd, s),
           ((T // s) * (heads // t), s, s, hd), (1, T, d // t, d)]
    fw = {"column_parallel_linear": [col], "row_parallel_linear": [row], "mlp": [col, row],
          "attention": att, "block": att + [col, row]}[layer]
    out = list(fw)
    if fb:
        for (b, m, k, n) in fw:
            out += [(b, m, n, k), (b, k, m, n)]
    return out


def gsec(g):
    b, m, k, n = g
    return 2.0 * b * m * k * n / 400e12 + 8e-6


shapes = set()
for layer in ["column_parallel_linear", "row_parallel_linear", "mlp", "attention", "block"]:
    for t in (1, 2, 4, 8):
        for fb in (False, True):
            shapes |= set(gemms(layer, t, fb))
lines = ["# FORMAT SAMPLE (tools/testdata/gpu_report_sample/make_sample.py): synthetic numbers,",
         "# NOT results. Real profiles come from tp_bench --device=cuda --profile_out on a GPU.",
         "device SAMPLE-GPU (synthetic, not a measurement)"]
for g in sorted(shapes):
    lines.append("gemm bf16 %d %d %d %d %.9g" % (g + (gsec(g),)))
act = T * d * 2
coll = {}
for op in ("all_reduce", "all_gather", "reduce_scatter"):
    for t in (1, 2, 4, 8):
        coll[(op, t)] = 1e-5 + t * act / 1e12
        lines.append("collective %s bf16 %d %d %.9g" % (op, t, act, coll[(op, t)]))
bench = []
for sp in (False, True):
    for t in (1, 2, 4, 8):
        comp = t * sum(gsec(g) for g in gemms("mlp", t, True))
        comm = (2 * coll[("all_reduce", t)] if not sp
                else 2 * (coll[("all_gather", t)] + coll[("reduce_scatter", t)]))
        meas = 1.15 * (comp + comm)
        name = "mlp/tp:%d/tokens:%d/d:%d%s/fwd_bwd/cuda_shared/bf16" % (t, T, d, "/sp" if sp else "")
        lines.append("layer %s %.9g %.9g" % (name, meas, meas * 1.3))
        flops = 3 * 2 * (2 * T * d * f)
        bench.append({"name": name + "/iterations:5/manual_time", "real_time": 1e3 * meas,
                      "time_unit": "ms", "FLOP/s": flops / meas, "fenced_ms": 1.3e3 * meas,
                      "comm_ms": 1e3 * comm, "comm_bytes": act * 2, "cpu_ms": 0.5,
                      "vs_unsharded": meas / (1.15 * sum(gsec(g) for g in gemms("mlp", 1, True)))})
lines.append("layer async_tp_mlp/tp:2/tokens:256/d:512/sp/fwd_bwd/cuda_shared/bf16 0.0002 0.00025")
bench.insert(0, {"name": "mlp/unsharded/tokens:256/d:512/fwd_bwd/cuda_shared/bf16/iterations:5/"
                         "manual_time", "real_time": 1.15e3 * sum(gsec(g) for g in gemms("mlp", 1, True)),
                 "time_unit": "ms", "FLOP/s": 1e12, "fenced_ms": 0.2, "cpu_ms": 0.1})
bench.append({"name": "attention/tp:8/tokens:256/d:512/sp/fwd_bwd/cuda_shared/bf16/iterations:5/"
                      "manual_time", "error_occurred": True,
              "error_message": "SAMPLE error message of a failed row", "real_time": 0,
              "time_unit": "ms"})
for g in [(1, T, d, f), (1, T, d, f // 8)]:
    bench.append({"name": "gemm/dtype:bf16/batch:%d/m:%d/k:%d/n:%d/iterations:1/manual_time" % g,
                  "real_time": 1e6 * gsec(g), "time_unit": "us",
                  "TFLOP/s": 2.0 * g[0] * g[1] * g[2] * g[3] / gsec(g) / 1e12})
bench.append({"name": "collective/all_reduce/cuda_shared/dtype:bf16/t:4/bytes:%d/iterations:1/"
                      "manual_time" % act, "real_time": 1e6 * coll[("all_reduce", 4)],
              "time_unit": "us", "busbw_GB/s": 1.5 * act / coll[("all_reduce", 4)] / 1e9})
open("tp_gpu_profile.txt", "w").write("\n".join(lines) + "\n")
json.dump({"context": {"date": "SAMPLE", "devices": "virtual ranks sharing GPU 0, a stream each",
                       "gpu0": "SAMPLE-GPU (synthetic)"}, "benchmarks": bench},
          open("tp_bench_cuda.json", "w"), indent=1)
open("machine.txt", "w").write(
    "# FORMAT SAMPLE: synthetic machine description, not a real run\n"
    "date=2000-01-01T00:00:00Z\ncommit=0000000-sample\nhost=sample-host\n"
    "gpu=SAMPLE-GPU 80GB\ngpus=1\ndriver=000.00\ncuda=00.0\ncpu=SAMPLE CPU\ncores=16\n"
    "tokens=256\nd=512\nsteps=5\n")
