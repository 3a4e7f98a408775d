#!/usr/bin/python3
"""Counts test cases from Bazel's test XML for one `bazel test` run and says what did not run.

  bazel test //... 2>&1 | tee log
  python3 tools/test_summary.py --log log --label "with CUDA" --counts counts.txt

Reads the target status lines of the run's output ("//pkg:t  (cached) PASSED in 1.0s") and, for
each target, bazel-testlogs/<pkg>/<t>/test.xml (and shard_*/run_* subfolders): every <testcase>
is passed, failed (a <failure> or <error> child) or skipped (result="skipped"/"suppressed", or
status="notrun" for DISABLED_ tests). Lists the skipped cases per target with the reason the test
gave (e.g. "no GPU: ..."), the targets that executed no test case, and the failures. A target
that failed without XML (FAILED TO BUILD, NO STATUS) counts as one failed case. Ends with
"LABEL: N passed, N failed, N skipped" (test cases) and appends "N N N" to --counts.
"""
import argparse
import collections
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?"
                    r"(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|SKIPPED|"
                    r"INCOMPLETE|REMOTE FAILURE)\b")


def target_dir(testlogs, target):
    pkg, _, name = target[2:].partition(":")
    return os.path.join(testlogs, pkg, name)


def xml_files(testlogs, target):
    d = target_dir(testlogs, target)
    found = [os.path.join(d, "test.xml")]
    for pattern in ("shard_*/test.xml", "run_*/test.xml", "shard_*/run_*/test.xml"):
        found += sorted(glob.glob(os.path.join(d, pattern)))
    return [f for f in found if os.path.isfile(f)]


def reason(element):
    """The skip/failure text without gtest's leading 'file:line' line, on one line."""
    text = element.get("message") or element.text or ""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    if len(lines) > 1 and re.match(r"^\S+:\d+$", lines[0]):
        lines = lines[1:]
    text = " ".join(lines) or "(no reason given)"
    return text if len(text) <= 160 else text[:157] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True, help="the output of one `bazel test` run")
    ap.add_argument("--label", required=True)
    ap.add_argument("--testlogs", default="bazel-testlogs")
    ap.add_argument("--counts", help="file to append 'passed failed skipped' to")
    args = ap.parse_args()

    targets = collections.OrderedDict()
    with open(args.log, errors="replace") as f:
        for line in f:
            m = STATUS.match(line.strip())
            if m:
                targets[m.group(1)] = m.group(2)

    passed = failed = skipped = 0
    skips = collections.OrderedDict()   # target -> [(case, reason)]
    failures = []                       # "target: case: reason"
    empty = []                          # targets that executed no test case
    for target, status in targets.items():
        if status == "SKIPPED":
            skipped += 1
            skips.setdefault(target, []).append(("(whole target)", "skipped by Bazel"))
            empty.append(target)
            continue
        files = xml_files(args.testlogs, target)
        if status in ("FAILED TO BUILD", "NO STATUS", "INCOMPLETE", "REMOTE FAILURE") or not files:
            failed += 1
            failures.append(f"{target}: {status}" + ("" if files else " (no test XML)"))
            continue
        ran = 0
        target_failed = False
        for path in files:
            try:
                root = ET.parse(path).getroot()
            except ET.ParseError as e:
                failed += 1
                target_failed = True
                failures.append(f"{target}: unreadable {path}: {e}")
                continue
            for case in root.iter("testcase"):
                name = ".".join(x for x in (case.get("classname"), case.get("name")) if x)
                bad = case.find("failure")
                if bad is None:
                    bad = case.find("error")
                skip = case.find("skipped")
                if bad is not None:
                    failed += 1
                    ran += 1
                    target_failed = True
                    failures.append(f"{target}: {name}: {reason(bad)}")
                elif (case.get("result") in ("skipped", "suppressed") or skip is not None
                      or case.get("status") == "notrun"):
                    skipped += 1
                    why = reason(skip) if skip is not None else (
                        "disabled (DISABLED_ prefix)" if case.get("status") == "notrun" else "skipped")
                    skips.setdefault(target, []).append((name, why))
                else:
                    passed += 1
                    ran += 1
        if status in ("FAILED", "TIMEOUT") and not target_failed:
            # The binary failed (crash, timeout, exit code) after or outside its test cases.
            failed += 1
            failures.append(f"{target}: {status} (outside any test case; see its test.log)")
        if ran == 0 and not target_failed:
            empty.append(target)

    label = args.label
    if skips:
        print(f"-- {label}: skipped test cases, by target and reason")
        for target, cases in skips.items():
            by_reason = collections.OrderedDict()
            for name, why in cases:
                by_reason.setdefault(why, []).append(name)
            for why, names in by_reason.items():
                shown = ", ".join(names[:4]) + (f", ... ({len(names)} cases)" if len(names) > 4 else "")
                print(f"   {target}: {shown}: {why}")
    if empty:
        print(f"-- {label}: targets that executed no test case ({len(empty)}): "
              + " ".join(empty))
    if failures:
        print(f"-- {label}: failures")
        for f in failures:
            print(f"   {f}")
    print(f"-- {label}: {len(targets)} test targets")
    print(f"{label}: {passed} passed, {failed} failed, {skipped} skipped")
    if args.counts:
        with open(args.counts, "a") as f:
            f.write(f"{passed} {failed} {skipped}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
