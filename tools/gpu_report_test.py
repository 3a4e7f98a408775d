"""tools/gpu_report.py on made-up logs: what the GPU run's report says (runs without a GPU)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_report  # noqa: E402

TRAIN = """config ...
step 0 loss 10.99 | 1/5, ETA 1s, 16384 tokens seen, lr 0.001, grad norm 1.2 | 900.0 ms/step | 18204 tokens/s | no communication | peak GPU memory 20.50 GiB
step 1 loss 10.50 | 2/5, ETA 1s, 32768 tokens seen, lr 0.001, grad norm 1.1 | 300.0 ms/step | 54613 tokens/s | no communication | peak GPU memory 20.50 GiB
step 2 loss 10.25 | 3/5, ETA 1s, 49152 tokens seen, lr 0.001, grad norm 1.0 | 160.0 ms/step | 102400 tokens/s | no communication
step 3 loss 10.00 | 4/5, ETA 1s, 65536 tokens seen, lr 0.001, grad norm 1.0 | 150.0 ms/step | 109226 tokens/s | no communication
step 4 loss 9.75 | 5/5, ETA 0s, 81920 tokens seen, lr 0.001, grad norm 1.0 | 170.0 ms/step | 96376 tokens/s | no communication
GPU: peak memory 20.50 GiB on NVIDIA H100; CUDA graph: captured (3 replays)
"""


def write(tmp, name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


class GpuReportTest(unittest.TestCase):
    def test_train_row_takes_the_median_after_two_steps_and_the_mfu(self):
        class A:
            layers, d_model, vocab, seq, peak_tflops = 12, 768, 50304, 1024, 989.4
        row = gpu_report.train_row(TRAIN, A)
        self.assertIn("102,400", row)  # median of 102400, 109226, 96376
        n = gpu_report.gpt_params(12, 768, 50304, 1024)
        self.assertEqual(n, 124475904)  # GPT-2 124M with the padded vocabulary
        mfu = (6 * n + 12 * 12 * 768 * 1024) * 102400 / 989.4e12
        self.assertIn(f"{100 * mfu:.1f}%", row)
        self.assertIn("20.50 GiB", row)

    def test_train_row_without_steps_says_so(self):
        class A:
            layers, d_model, vocab, seq, peak_tflops = 12, 768, 50304, 1024, 989.4
        self.assertIn("no step finished", gpu_report.train_row("error: out of memory", A))

    def test_determinism_compares_loss_lines_bitwise(self):
        with tempfile.TemporaryDirectory() as tmp:
            a = write(tmp, "a.log", TRAIN)
            b = write(tmp, "b.log", TRAIN.replace("9.75 |", "9.750000001 |"))
            self.assertEqual(gpu_report.main(["determinism", a, a]), 0)
            import io, contextlib
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                gpu_report.main(["determinism", a, a])
            self.assertIn("bitwise equal: 5 steps, last loss 9.75", buf.getvalue())
            self.assertIn("99,388 and 99,388", buf.getvalue())  # median of steps 1..4
            self.assertEqual(gpu_report.main(["determinism", a, b]), 1)
            empty = write(tmp, "c.log", "crashed")
            self.assertEqual(gpu_report.main(["determinism", a, empty]), 1)

    def test_attention_table_ratio_and_flag(self):
        with tempfile.TemporaryDirectory() as tmp:
            ours = write(tmp, "ours.json", json.dumps({"benchmarks": [
                {"name": "BM_CudaKernelTcBf16/16/1024/12/64", "TFLOP/s": 150.0},
                {"name": "BM_CudaKernelSimtBf16/16/1024/12/64", "TFLOP/s": 40.0},
                {"name": "BM_CudaKernelTcBf16/8/1024/6/128", "TFLOP/s": 100.0}]}))
            theirs = write(tmp, "t.jsonl", "\n".join(json.dumps(r) for r in [
                {"batch": 16, "seq": 1024, "heads": 12, "head_dim": 64, "tflops": 200.0,
                 "backend": "flash"},
                {"batch": 8, "seq": 1024, "heads": 6, "head_dim": 128, "tflops": 250.0,
                 "backend": "flash"}]))
            table = gpu_report.attention_table(ours, theirs)
        self.assertIn("| (16, 1024, 12, 64) | 150.0 | 40.0 | 200.0 (flash) | 0.75x |", table)
        self.assertIn("0.40x (below 0.7x", table)

    def test_skipped_cases_with_their_reasons(self):
        log = """[ RUN      ] GptGpuTest.OneRankPerGpuGivesTheOneRankLosses
tests/gpt_gpu_test.cc:167: Skipped
needs 2 GPUs, found 1

[  SKIPPED ] GptGpuTest.OneRankPerGpuGivesTheOneRankLosses (0 ms)
[  SKIPPED ] 1 test, listed below:
[  SKIPPED ] GptGpuTest.OneRankPerGpuGivesTheOneRankLosses
"""
        with tempfile.TemporaryDirectory() as tmp:
            path = write(tmp, "gpt_gpu_test.log", log)
            self.assertEqual(gpu_report.skipped([path]), [
                "- gpt_gpu_test: GptGpuTest.OneRankPerGpuGivesTheOneRankLosses: needs 2 GPUs, "
                "found 1"])

    def overlap_result(self, passed=True, waits_off_1=None):
        waits_off_1 = waits_off_1 or {"d2h_read": 1}
        step = lambda n, waits, expected, ops, ov: {
            "step": n, "seconds": 0.1, "host_waits": {"total": sum(waits.values()),
                                                     "by_kind": waits},
            "expected_host_waits": expected, "blocking_collectives": ops, "calls": 3,
            "comm_ms": 2.0, "compute_ms": 9.0, "overlap_ms": ov}
        return {"world": 2, "pass": passed, "why": "" if passed else "no overlap; ",
                "streams": [{"rep": 0, "calls": 1, "comm_ms": 0.5, "compute_ms": 2.0,
                             "overlap_ms": 0.4, "host_waits": {"total": 0, "by_kind": {}}}],
                "gpt": {"config": "small", "overlap_ms": 3.5, "comm_ms": 4.0,
                        "step_s_on": 0.08, "step_s_off": 0.1, "ratio_on_off": 0.8,
                        "on": [step(0, {"stream_sync": 3, "d2h_read": 1}, 1,
                                    ["all_reduce", "all_reduce"], 0.0),
                               step(1, {"d2h_read": 1}, 1, ["all_reduce"], 1.5),
                               step(2, {"d2h_read": 1}, 1, ["all_reduce"], 2.0)],
                        "off": [step(0, {"d2h_read": 1}, 1, [], 0.0),
                                step(1, waits_off_1, 1, [], 0.0)]}}

    def test_overlap_summarises_a_passing_check(self):
        import io, contextlib
        with tempfile.TemporaryDirectory() as tmp:
            path = write(tmp, "overlap_2.json", json.dumps(self.overlap_result()))
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                self.assertEqual(gpu_report.main(["overlap", path]), 0)
        text = buf.getvalue()
        self.assertIn("- 2 rank(s): **PASS**", text)
        self.assertIn("3.500 ms of 4.000 ms", text)
        self.assertIn("on/off 0.800", text)
        self.assertIn("1 (d2h_read=1) vs 1", text)
        self.assertIn("all_reduce x1", text)  # steps 1 and 2: one each (step 0 not counted)
        self.assertIn("stream-ordered", text)
        self.assertNotIn("other than the loss read", text)  # step 0's syncs are the warm-up's
        self.assertIn("streams rep 0", text)

    def test_overlap_names_host_waits_other_than_the_loss_read(self):
        import io, contextlib
        with tempfile.TemporaryDirectory() as tmp:
            path = write(tmp, "overlap_2.json", json.dumps(self.overlap_result(
                False, {"nccl_blocking_call": 2, "d2h_read": 1})))
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                self.assertEqual(gpu_report.main(["overlap", path]), 1)
        text = buf.getvalue()
        self.assertIn("host waits other than the loss read (each fails the check): "
                      "off step 1: nccl_blocking_call=2", text)
        self.assertIn("3 (d2h_read=1, nccl_blocking_call=2) vs 1", text)

    def test_overlap_fails_without_a_passing_result(self):
        import io, contextlib
        with tempfile.TemporaryDirectory() as tmp:
            failed = write(tmp, "overlap_1.json", json.dumps(self.overlap_result(False)))
            broken = write(tmp, "broken.json", "{not json")
            missing = os.path.join(tmp, "missing.json")
            write(tmp, "missing.log", "launch: starting 2 ranks\n[rank 0] gpu_nccl_overlap_check: "
                  "NCCL error: invalid usage (Duplicate GPU detected)\n")
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                self.assertEqual(gpu_report.main(["overlap", failed, broken, missing]), 1)
                self.assertEqual(gpu_report.main(["overlap", failed, write(
                    tmp, "ok.json", json.dumps(self.overlap_result()))]), 0)
        text = buf.getvalue()
        self.assertIn("**FAIL: no overlap**", text)
        self.assertIn("broken.json: unreadable", text)
        self.assertIn("missing.json: no result (the check did not finish: [rank 0] "
                      "gpu_nccl_overlap_check: NCCL error: invalid usage (Duplicate GPU "
                      "detected); see missing.log)", text)


if __name__ == "__main__":
    unittest.main()
