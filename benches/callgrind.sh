#!/usr/bin/env bash
# Instructions per review for every case of the review bench: (Ir(N) - Ir(0)) / N.
# usage: callgrind.sh BENCH_BINARY [N] [filter]
set -euo pipefail
B=$1; N=${2:-200}; F=${3:-}

cases=$( (TOLLGATE_BENCH_LOOP=__list__:0 RUST_BACKTRACE=0 "$B" 2>&1 || true) | sed -n 's/.*cases: \[\(.*\)\].*/\1/p' | tr -d '"' | tr ',' '\n' | tr -d ' ')
ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
for c in $cases; do
  [[ -n "$F" && "$c" != *$F* ]] && continue
  a=$(TOLLGATE_BENCH_LOOP=$c:$N ir "$B")
  z=$(TOLLGATE_BENCH_LOOP=$c:0 ir "$B")
  echo "$c $(( (a - z) / N ))"
done
