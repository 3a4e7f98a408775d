#!/usr/bin/python3
"""tools/test_summary.py against hand-written Bazel logs and gtest XML: passed, failed, skipped
(with the reason, file:line stripped), disabled, a target skipped by Bazel, a target that failed
to build, a crash outside any case, and a gpu variant whose cases were skipped for lack of a GPU.
"""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARY = os.path.join(HERE, "test_summary.py")

# gtest 1.12's XML shapes (see XmlUnitTestResultPrinter::OutputXmlTestResult).
PASS = '<testcase name="{n}" status="run" result="completed" time="0" classname="{c}" />'
FAIL = ('<testcase name="{n}" status="run" result="completed" time="0" classname="{c}">'
        '<failure message="a_test.cc:12&#x0A;Value of: x&#x0A;  Actual: false" type="">'
        '<![CDATA[a_test.cc:12\nValue of: x]]></failure></testcase>')
SKIP = ('<testcase name="{n}" status="run" result="skipped" time="0" classname="{c}">'
        '<skipped message="placement.cc:31&#x0A;no GPU: built without the CUDA toolkit">'
        '<![CDATA[placement.cc:31\nno GPU: built without the CUDA toolkit]]></skipped>'
        '</testcase>')
DISABLED = '<testcase name="DISABLED_{n}" status="notrun" result="suppressed" time="0" classname="{c}" />'


def xml(*cases):
    body = "".join(cases)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites tests="1" name="AllTests">'
            f'<testsuite name="S" tests="1">{body}</testsuite></testsuites>\n')


class TestSummaryTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.testlogs = os.path.join(self.dir, "testlogs")

    def tearDown(self):
        self.tmp.cleanup()

    def write_xml(self, target, content, sub=""):
        pkg, _, name = target[2:].partition(":")
        d = os.path.join(self.testlogs, pkg, name, sub)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "test.xml"), "w") as f:
            f.write(content)

    def run_summary(self, log_lines):
        log = os.path.join(self.dir, "log")
        counts = os.path.join(self.dir, "counts")
        with open(log, "w") as f:
            f.write("\n".join(log_lines) + "\n")
        out = subprocess.run(
            [sys.executable, SUMMARY, "--log", log, "--label", "L", "--testlogs",
             self.testlogs, "--counts", counts],
            check=True, capture_output=True, text=True).stdout
        with open(counts) as f:
            return out, f.read().split()

    def test_counts_cases_by_outcome(self):
        self.write_xml("//a:t", xml(PASS.format(n="P1", c="S"), PASS.format(n="P2", c="S"),
                                    FAIL.format(n="F", c="S"), DISABLED.format(n="D", c="S")))
        out, counts = self.run_summary(["//a:t      FAILED in 1.0s"])
        self.assertEqual(counts, ["2", "1", "1"])
        self.assertIn("//a:t: S.F: Value of: x", out)   # the file:line line is dropped
        self.assertIn("disabled (DISABLED_ prefix)", out)
        self.assertIn("L: 2 passed, 1 failed, 1 skipped", out)

    def test_gpu_variant_without_a_gpu_is_skipped_with_its_reason(self):
        self.write_xml("//spmd_testing:testing_test_gpu",
                       xml(*[SKIP.format(n=f"T{i}", c="S") for i in range(15)]))
        out, counts = self.run_summary(
            ["//spmd_testing:testing_test_gpu    (cached) PASSED in 0.4s"])
        self.assertEqual(counts, ["0", "0", "15"])
        self.assertIn("//spmd_testing:testing_test_gpu: S.T0, S.T1, S.T2, S.T3, ... (15 cases): "
                      "no GPU: built without the CUDA toolkit", out)
        # Nothing ran there: the target is listed as having executed no test case.
        self.assertIn("targets that executed no test case (1): //spmd_testing:testing_test_gpu",
                      out)

    def test_targets_without_cases(self):
        self.write_xml("//c:crash", xml(PASS.format(n="P", c="S")))
        out, counts = self.run_summary([
            "//b:skipped_by_bazel   SKIPPED",
            "//b:broken   FAILED TO BUILD",
            "//c:crash   FAILED in 2.0s",
            "//c:no_xml   PASSED in 2.0s",
        ])
        # crash: 1 passed case + 1 failure outside any case; broken and no_xml: 1 failure each.
        self.assertEqual(counts, ["1", "3", "1"])
        self.assertIn("//b:broken: FAILED TO BUILD", out)
        self.assertIn("//c:crash: FAILED (outside any test case", out)
        self.assertIn("//c:no_xml: PASSED (no test XML)", out)
        self.assertIn("//b:skipped_by_bazel: (whole target): skipped by Bazel", out)

    def test_reads_shards(self):
        self.write_xml("//d:sharded", xml(PASS.format(n="A", c="S")), sub="shard_1_of_2")
        self.write_xml("//d:sharded", xml(SKIP.format(n="B", c="S")), sub="shard_2_of_2")
        out, counts = self.run_summary(["//d:sharded   PASSED in 1.0s"])
        self.assertEqual(counts, ["1", "0", "1"])


if __name__ == "__main__":
    unittest.main()
