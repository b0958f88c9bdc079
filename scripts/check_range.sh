#!/usr/bin/env bash
# The supported-range check: tests/range_subset.txt on the floor or the newest releases, each in its
# own venv (scripts/setup_range.sh; made when absent, or always with --fresh as CI does).
# Usage: scripts/check_range.sh floor|newest [--fresh] [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:?usage: scripts/check_range.sh floor|newest [--fresh] [pytest args]}"
shift
fresh=0
if [ "${1:-}" = "--fresh" ]; then fresh=1; shift; fi
if [ "$fresh" = 1 ] || [ ! -x ".venv-$which/bin/pytest" ]; then
    scripts/setup_range.sh "$which"
fi
mapfile -t subset < <(grep -vE '^\s*(#|$)' tests/range_subset.txt)
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" ".venv-$which/bin/pytest" -q "${subset[@]}" "$@"
