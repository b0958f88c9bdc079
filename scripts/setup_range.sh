#!/usr/bin/env bash
# Create .venv-floor or .venv-newest: trainwright[dev,hf,peft] on the lowest supported versions
# (constraints-floor.txt) or on the newest releases (constraints-newest.txt), for the range check
# (scripts/check_range.sh, README "Supported versions"). torch first, at the version the constraints file
# names, then the rest constrained so nothing moves it. Usage: scripts/setup_range.sh floor|newest
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:?usage: scripts/setup_range.sh floor|newest}"
case "$which" in floor|newest) ;; *) echo "setup_range.sh: floor or newest, not '$which'" >&2; exit 2 ;; esac
venv=".venv-$which"
constraints="constraints-$which.txt"
torch_pin="$(grep -E '^torch==' "$constraints")"
rm -rf "$venv"
python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/pip" install -q "$torch_pin"
DS_BUILD_OPS=0 "$venv/bin/pip" install -q -c "$constraints" -e ".[dev,hf,peft]"
"$venv/bin/python" - <<'PY'
import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in
               ("torch", "transformers", "accelerate", "datasets", "huggingface_hub", "peft", "tokenizers")))
PY
