#!/usr/bin/env bash
# Interleaved W1 runs across commits, for A/B and bisection on a noisy machine:
#   bench/ab_commits.sh "eo-3-stages 1000" ROUNDS COMMIT...
#   bench/ab_commits.sh "eo-3-stages 1000 --replication 1" ROUNDS COMMIT...
# Each commit is exported (git archive) to /tmp/ms-ab/<commit> with this checkout's
# bench/w1_single.py and bench/cpu.py copied in (it reports the CPU seconds of the process
# tree), then every round runs every commit once, in order.
set -euo pipefail
variant=$1; rounds=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
for c in "$@"; do
  rm -rf "/tmp/ms-ab/$c"; mkdir -p "/tmp/ms-ab/$c"
  git -C "$here" archive "$c" | tar -x -C "/tmp/ms-ab/$c"
  cp "$here/bench/w1_single.py" "$here/bench/cpu.py" "/tmp/ms-ab/$c/bench/"
done
for _ in $(seq "$rounds"); do
  for c in "$@"; do
    # shellcheck disable=SC2086
    echo "$c $(cd "/tmp/ms-ab/$c" && PYTHONPATH="/tmp/ms-ab/$c" "$here/.venv/bin/python" -m bench.w1_single ${variant%% --*} 15 ${variant#"${variant%% --*}"} 2>/dev/null | tail -1)"
  done
done
