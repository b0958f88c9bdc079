#!/usr/bin/env bash
# Create .venv with the pinned, tested versions. torch first (the CPU wheel), then the rest,
# constrained so nothing upgrades it. Usage: scripts/setup.sh [EXTRAS]   e.g. scripts/setup.sh dev,hf
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/pip install -q "torch==2.13.0"
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
DS_BUILD_OPS=0 .venv/bin/pip install -q -c constraints.txt -e "$spec"  # DeepSpeed: no ops built at install
