"""gpt_gpu_table.py on a small gpt_bench JSON (one row cut off, as a timed-out run leaves it) and
PyTorch JSON lines: the ratios against eager and torch.compile, and the empty-input notes."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "gpt_gpu_table.py")


def run(ours_text, torch_rows):
    with tempfile.TemporaryDirectory() as d:
        ours, torch_path = os.path.join(d, "o.json"), os.path.join(d, "t.jsonl")
        with open(ours, "w") as f:
            f.write(ours_text)
        with open(torch_path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in torch_rows))
        return subprocess.run([sys.executable, TABLE, ours, torch_path], check=True,
                              capture_output=True, text=True).stdout


TORCH = [{"torch": "2.11", "mode": "eager", "dtype": "bf16", "card": "NVIDIA H200",
          "step_ms": 50.0, "tokens_per_s": 400000.0, "mfu": 0.3, "peak_bytes": 2 * 2**30},
         {"torch": "2.11", "mode": "compile", "dtype": "bf16", "card": "NVIDIA H200",
          "step_ms": 25.0, "tokens_per_s": 800000.0, "mfu": 0.6, "peak_bytes": 2**30}]


class GptGpuTableTest(unittest.TestCase):
    def test_ratios_against_eager_and_compile(self):
        # The second benchmark is cut off mid-object: the first must still be read.
        ours = ('{"benchmarks": [{"name": "gpt_step/cuda/bf16/gpt2_124m/mesh:1", '
                '"run_type": "iteration", "tokens_per_s": 200000, "step_ms": 100, "mfu": 0.15, '
                '"peak_mem_MiB": 1024},\n{"name": "gpt_step/cuda/bf16/gpt2_124m/mesh:tp2", "tok')
        out = run(ours, TORCH)
        self.assertIn("NVIDIA H200 (PyTorch 2.11)", out)
        row = [l for l in out.splitlines() if l.startswith("| ours")]
        self.assertEqual(len(row), 1, out)
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        # tokens/s, step ms, MFU, peak GiB, / eager speed, / compile speed, peak / eager
        self.assertEqual(cells[1:], ["200000", "100.00", "15.0%", "1.00", "0.50", "0.25", "0.50"])

    def test_missing_sides_are_said(self):
        out = run('{"benchmarks": []}', [])
        self.assertIn("no gpt_bench rows", out)
        self.assertIn("no PyTorch rows", out)


if __name__ == "__main__":
    unittest.main()
