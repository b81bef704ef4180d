#!/usr/bin/env bash
# Runs one fuzz target for a set time on the stable toolchain.
#
#   fuzz/run.sh TARGET [SECONDS] [extra libFuzzer flags...]
#   fuzz/run.sh list
#
# TARGET: review_bytes, review_structured, pod_engine, policy_text, quantity.
# Environment: FUZZ_SANITIZER=none|address (default none: the crate forbids unsafe code),
# FUZZ_JOBS=N parallel workers (default 1), CARGO_TARGET_DIR as usual.
# New inputs go to fuzz/corpus/TARGET, crashes to fuzz/artifacts/TARGET (both untracked);
# the committed seeds in fuzz/seeds/TARGET are read, never written.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/.."
command -v cargo-fuzz >/dev/null || {
  echo "cargo-fuzz missing: cargo install cargo-fuzz --locked" >&2
  exit 2
}
# cargo-fuzz passes -Z flags to rustc; the stable compiler accepts them with this.
export RUSTC_BOOTSTRAP=1
if [ "${1:-}" = list ] || [ $# -eq 0 ]; then
  cargo fuzz list
  exit 0
fi
target=$1
secs=${2:-60}
shift
[ $# -gt 0 ] && shift
sanitizer=${FUZZ_SANITIZER:-none}
jobs=${FUZZ_JOBS:-1}
corpus="fuzz/corpus/$target"
seeds="fuzz/seeds/$target"
mkdir -p "$corpus" "fuzz/artifacts/$target"
extra=()
[ -f "fuzz/dict/$target.dict" ] && extra+=("-dict=fuzz/dict/$target.dict")
# libFuzzer's -jobs mode writes fuzz-N.log files; only for more than one worker.
[ "$jobs" -gt 1 ] && extra+=("-jobs=$jobs" "-workers=$jobs")
# -a: debug assertions and overflow checks on, so an arithmetic overflow is a crash.
exec cargo fuzz run -a --sanitizer "$sanitizer" "$target" "$corpus" "$seeds" -- \
  -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
  -max_len=65536 "${extra[@]}" "$@"
