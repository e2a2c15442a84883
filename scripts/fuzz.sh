#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of wire and device data and of the
# model (fuzz/README.md): builds every cargo-fuzz target, runs each for
# SECONDS (60 by default) from its corpus (fuzz/corpus/TARGET, seeded from
# fuzz/seeds/TARGET), and prints per target the executions, executions per
# second, libFuzzer's coverage (cov: edges, ft: features), the corpus size
# and the crashes (left in fuzz/artifacts/TARGET/).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --smoke          # CI: clippy on the fuzz crate, build every
#                                    # target, replay each seed corpus once and
#                                    # the fixed crashes in fuzz/findings (a
#                                    # target that no longer builds, has a clippy
#                                    # warning, or crashes on one, fails)
#
# Environment: FUZZ_SANITIZER (none by default; address for ASan, slower),
# FUZZ_ARGS (more libFuzzer flags, e.g. "-jobs=2 -workers=2" or
# "-runs=10000000"), FUZZ_LOGDIR (keep each target's libFuzzer log there),
# GLIBC_TUNABLES (by default malloc keeps freed memory instead of handing it
# back to the kernel: the targets build rigs of megabytes per input, and
# fresh pages cost page faults and zeroing, 2 to 11 times the executions).
#
# "cov@" and "ft@" are the execution at which the coverage (edges) and the
# features last grew: far below "execs" means the coverage stopped growing.
# Installs cargo-fuzz under target/tools on first use (crates.io); the
# libFuzzer build runs on the pinned stable toolchain with RUSTC_BOOTSTRAP=1.
set -euo pipefail
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh

smoke=0
secs=60
if [ "${1:-}" = "--smoke" ]; then
    smoke=1
    secs=2
    shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
    secs=$1
    shift
fi

ensure_cargo_fuzz || exit 1
export RUSTC_BOOTSTRAP=1
san=${FUZZ_SANITIZER:-none}
profile=()  # release with debug assertions and overflow checks (cargo-fuzz default)
bindir=fuzz/target/x86_64-unknown-linux-gnu/release
if [ $smoke = 1 ]; then
    # Unoptimised: builds in about half the time, runs slower, enough to
    # see that every target builds and replays its seeds.
    profile=(--dev)
    bindir=fuzz/target/x86_64-unknown-linux-gnu/debug
fi

mapfile -t all < <(cd fuzz && cargo fuzz list)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

if [ $smoke = 1 ]; then
    # The targets are code too: clippy holds them to the workspace's bar.
    say "== cargo clippy (fuzz crate)"
    (cd fuzz && cargo clippy --quiet --bins --lib -- -D warnings >&2)
fi
say "== building ${#targets[@]} fuzz targets (sanitizer $san)"
one=()
[ ${#targets[@]} -eq 1 ] && one=("${targets[0]}")
(cd fuzz && cargo fuzz build "${profile[@]}" -s "$san" "${one[@]}" >&2)

failed=0
printf '%-12s %6s %12s %8s %7s %10s %7s %10s %7s %s\n' target seconds execs exec/s cov cov@ ft ft@ corpus crashes
for t in "${targets[@]}"; do
    corpus=fuzz/corpus/$t
    art=fuzz/artifacts/$t
    mkdir -p "$corpus" "$art"
    log=$(mktemp)
    seeds=()
    [ -d "fuzz/seeds/$t" ] && seeds=("fuzz/seeds/$t")
    before=$(find "$art" -type f | wc -l)
    # shellcheck disable=SC2086
    extra=()
    [ $smoke = 1 ] && extra=(-runs=0)
    "$bindir/$t" "$corpus" "${seeds[@]}" "${extra[@]}" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="$art/" -timeout=10 -rss_limit_mb=2048 ${FUZZ_ARGS:-} >"$log" 2>&1 || true
    after=$(find "$art" -type f | wc -l)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    # A target that dies before its first status line has none: no
    # figures, and the crash is reported below.
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
    # The execution of the last line on which cov (ft) was higher than on
    # the line before.
    read -r cov_at ft_at < <(awk '/^#[0-9]+.*cov: / {
            n = substr($1, 2); c = 0; f = 0
            for (i = 2; i < NF; i++) { if ($i == "cov:") c = $(i + 1); if ($i == "ft:") f = $(i + 1) }
            if (c + 0 > pc) { pc = c + 0; ca = n }
            if (f + 0 > pf) { pf = f + 0; fa = n }
        } END { print (ca == "" ? "?" : ca), (fa == "" ? "?" : fa) }' "$log")
    crashes=$((after - before))
    printf '%-12s %6s %12s %8s %7s %10s %7s %10s %7s %s\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" \
        "${cov:-?}" "$cov_at" "${ft:-?}" "$ft_at" "${corp:-?}" "$crashes"
    if [ "$crashes" -gt 0 ] || [ -z "$execs" ]; then
        failed=1
        grep -E 'panicked|ERROR: libFuzzer|Test unit written' "$log" | head -5 | sed 's/^/    /' || true
    fi
    # The crashes found and fixed (fuzz/findings/TARGET-*), each on a
    # fresh rig as it is replayed by hand: a fix undone fails the smoke.
    found=(fuzz/findings/"$t"-*)
    if [ $smoke = 1 ] && [ -f "${found[0]}" ] &&
        ! LEGOIB_FUZZ_FRESH=1 "$bindir/$t" "${found[@]}" >"$log.findings" 2>&1; then
        failed=1
        echo "    a crash in fuzz/findings is back:"
        grep -E 'Running:|panicked|ERROR: libFuzzer' "$log.findings" | head -5 | sed 's/^/    /' || true
    fi
    rm -f "$log.findings"
    if [ -n "${FUZZ_LOGDIR:-}" ]; then
        mkdir -p "$FUZZ_LOGDIR"
        cp "$log" "$FUZZ_LOGDIR/$t.log"
    fi
    rm -f "$log"
done
if [ $failed = 1 ]; then
    say "fuzz: a target crashed or did not run (inputs in fuzz/artifacts/; replay with the binary in $bindir and LEGOIB_FUZZ_FRESH=1)"
    exit 1
fi
