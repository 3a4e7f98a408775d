#!/usr/bin/env python3
"""Condenses plan_gpt outputs (docs_tables.sh) into docs/planner.md's markdown tables: the top
rows, then the best mesh of each family (no TP, TP, PP, CP) with its rank.

  python3 models/planner/docs_condense.py DIR NAME [TOP]
"""
import re
import sys

ROW = re.compile(r"^\s*(\d+|OOM)\s+(.+?)\s{2,}([\d.]+ (?:s|ms|us))\s+([\d.e+]+)\s+([\d.]+)%\s+([\d.]+)"
                 r"\s+([\d.]+ (?:s|ms|us))\s+([\d.]+ (?:s|ms|us))\s+([\d.]+)%")


def rows(path):
    out, header, error = [], [], None
    for line in open(path):
        m = ROW.match(line)
        if m:
            out.append(m.groups())
        elif line.startswith("plan:") or re.match(r"^\d+ candidates", line):
            header.append(line.strip())
        elif line.startswith("plan_gpt:") or line.startswith("no mesh fits"):
            error = line.strip()
        elif error and line.startswith("  "):
            error += "<br>" + line.strip()
    return out, header, error


def family(mesh):
    axes = dict(re.findall(r"(\w+)=(\d+)", mesh.split()[0]))
    return axes


def main():
    d, name = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    rs, header, error = rows(f"{d}/{name}.txt")
    cmd = open(f"{d}/{name}.txt").readline().strip()
    print(f"`{cmd[2:]}`\n")
    if error and not rs:
        print(f"> {error}\n")
        return
    if error:
        print(f"> {error}\n")
    unfit = [r for r in rs if r[0] == "OOM"]
    rs = [r for r in rs if r[0] != "OOM"]
    for h in header:
        print(f"{h}  ")
    print("\n| rank | mesh | step | tokens/s | MFU | GiB/GPU | compute | exposed comm | bubble |")
    print("|---|---|---|---|---|---|---|---|---|")
    shown = set()
    def emit(r, note=""):
        print(f"| {r[0]} | `{r[1]}`{note} | {r[2]} | {float(r[3]):.3g} | {r[4]}% | {r[5]} | {r[6]} | {r[7]} | {r[8]}% |")
        shown.add(r[0])
    for r in rs[:top]:
        emit(r)
    fams = [("best without TP", lambda a: "tp" not in a),
            ("best with TP", lambda a: "tp" in a),
            ("best with PP", lambda a: "pp" in a),
            ("best with CP", lambda a: "cp" in a),
            ("best pure FSDP", lambda a: set(a) == {"dp_shard"})]
    for label, pred in fams:
        for r in rs:
            if pred(family(r[1])):
                if r[0] not in shown:
                    emit(r, f" ({label})")
                break
        else:
            print(f"| - | ({label}: none runs or fits) | | | | | | | |")
    for r in unfit[:3 if rs else top]:
        emit(r, " (does not fit)")
    print()


main()
