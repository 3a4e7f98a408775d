#!/usr/bin/env bash
# Installs every Debian package shardmap needs. Idempotent: when all are present it only checks
# (about a second) and changes nothing. Run as root (or with sudo available) on Debian 12.
#
#   bash tools/setup.sh
set -euo pipefail

packages=(
  g++
  bazel-bootstrap bazel-rules-java bazel-platforms bazel-skylib
  libabsl-dev
  googletest libgtest-dev libgmock-dev
  libbenchmark-dev
  libopenblas-dev
  libgloo-dev
  nlohmann-json3-dev
  python3  # tools/test_summary.py reads Bazel's test XML
  libsleef-dev
  gnuplot-nox  # tools/bench_report.sh plots bench/tp_scaling.png
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
