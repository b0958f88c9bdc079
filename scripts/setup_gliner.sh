#!/usr/bin/env bash
# Create .venv-gliner for the GLiNER tests (tests/app/test_gliner.py): gliner 0.2.29 needs transformers<5.17,
# so it cannot share .venv. torch first (the CPU wheel), then trainwright[hf,dev,peft] and gliner,
# constrained by constraints-gliner.txt so nothing upgrades torch. Usage: scripts/setup_gliner.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python3.11 -m venv .venv-gliner 2>/dev/null || python3 -m venv .venv-gliner
.venv-gliner/bin/python -m pip install -q --upgrade pip
.venv-gliner/bin/pip install -q "torch==2.13.0"
DS_BUILD_OPS=0 .venv-gliner/bin/pip install -q -c constraints-gliner.txt -e ".[hf,dev,peft]" "gliner==0.2.29"
