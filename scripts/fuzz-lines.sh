#!/usr/bin/env bash
# Which lines of our tree a fuzz run reached for the first time, and when
# (fuzz/README.md "Lines, not edges"). Edges overstate what is new: a loop
# the compiler unrolls is many edges on one line, and a new branch out of
# a line reached before is a new edge but no new line. This replays the
# corpus as it stood at the run's start, after 1 and 5 million executions
# and at its end through a source-based coverage build of the target
# (`cargo fuzz coverage`, rustup's llvm-tools), and compares the lines of
# ours each replay reaches.
#
#   scripts/fuzz-lines.sh LOG TARGET [CORPUS]
#
# LOG is the run's libFuzzer log as FUZZ_LOGDIR keeps it (fuzz.sh copies it
# when the run ends, so its mtime is the end; FUZZ_END="YYYY-MM-DD
# HH:MM:SS" says otherwise). CORPUS is fuzz/corpus/TARGET by default.
# The corpus at execution N is the files with an mtime up to the time of
# N, plus fuzz/seeds/TARGET: libFuzzer never rewrites a file, and deletes
# only files of its own run that a smaller input replaced. So this works
# on a corpus runs have only added to, not on one minimised in place.
# libFuzzer's exec/s is the executions so far over the seconds since the
# process started; the time of execution N is the start plus N over the
# rate printed at N, the start the end less the total over the last rate.
set -euo pipefail

[ $# -ge 2 ] || {
    echo "usage: $0 LOG TARGET [CORPUS]" >&2
    exit 2
}
log=$1
target=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
corpus=${3:-$here/fuzz/corpus/$target}
[ -f "$log" ] || {
    echo "$0: no log $log" >&2
    exit 1
}
[ -d "$corpus" ] || {
    echo "$0: no corpus $corpus" >&2
    exit 1
}
corpus=$(cd "$corpus" && pwd)
log=$(cd "$(dirname "$log")" && pwd)/$(basename "$log")
cd "$here"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
ensure_cargo_fuzz || exit 1
tools=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin
if [ ! -x "$tools/llvm-cov" ]; then
    rustup component add llvm-tools --toolchain "$TOOLCHAIN" >&2 || exit 1
fi
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824}

end=$(date -d "${FUZZ_END:-@$(stat -c %Y "$log")}" +%s)
# "N RATE" of the log's status lines; the time of N from the first at or
# after it.
rates=$(awk '/^#[0-9]+/ { for (i = 2; i < NF; i++) if ($i == "exec/s:") print substr($1, 2), $(i + 1) }' "$log")
total=$(tail -n 1 <<<"$rates" | cut -d' ' -f1)
last=$(tail -n 1 <<<"$rates" | cut -d' ' -f2)
if [ -z "$total" ] || [ "${last:-0}" -le 0 ]; then
    echo "$0: no status line with exec/s in $log" >&2
    exit 1
fi
start=$((end - total / last))
at() { # at N: the time of execution N
    awk -v n="$1" -v s="$start" '$1 >= n && $2 > 0 { print s + int(n / $2); exit }' <<<"$rates"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== building $target with source-based coverage" >&2
# cargo fuzz coverage also replays the seeds into fuzz/coverage/TARGET:
# removed after, unless it was there before.
had_cov=0
[ -e "fuzz/coverage/$target" ] && had_cov=1
(cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz coverage -s none "$target" "$here/fuzz/seeds/$target" >"$work/build.log" 2>&1) || {
    tail -20 "$work/build.log" >&2
    exit 1
}
[ $had_cov = 1 ] || { rm -rf "fuzz/coverage/$target"; rmdir fuzz/coverage 2>/dev/null || true; }
bin=fuzz/target/x86_64-unknown-linux-gnu/coverage/x86_64-unknown-linux-gnu/release/$target

# lines NAME TIME: the lines of ours the corpus at TIME reaches, one
# "file:line" each, into $work/NAME.
lines() {
    local dir=$work/$1.in
    mkdir "$dir"
    find "$corpus" -maxdepth 1 -type f ! -newermt "@$2" -print0 >"$work/$1.files"
    xargs -0 -r cp -l -t "$dir" <"$work/$1.files" 2>/dev/null ||
        xargs -0 -r cp -t "$dir" <"$work/$1.files"
    cp -n "fuzz/seeds/$target"/* "$dir/" 2>/dev/null || true
    LLVM_PROFILE_FILE=$work/$1.profraw "$bin" -runs=0 "$dir" >"$work/$1.log" 2>&1 || {
        echo "$0: replaying the corpus at $(date -u -d "@$2" +%T) failed ($work/$1.log):" >&2
        tail -5 "$work/$1.log" >&2
        exit 1
    }
    "$tools/llvm-profdata" merge -sparse "$work/$1.profraw" -o "$work/$1.profdata"
    "$tools/llvm-cov" export -format=lcov -instr-profile "$work/$1.profdata" "$bin" 2>/dev/null |
        awk -F'[:,]' -v root="$here/" '
            /^SF:/ { f = substr($0, 4); ours = index(f, root) == 1 && index(f, "/target/") == 0
                     sub(root, "", f)
                     # a fixture included with #[path] reads fuzz/src/../../CRATE/...
                     while (f ~ /[^\/.][^\/]*\/\.\.\//) sub(/[^\/.][^\/]*\/\.\.\//, "", f) }
            /^DA:/ && ours { print f ":" $2 ":" ($3 > 0) }' | sort -u >"$work/$1.all"
    awk -F: '$3 == 1 { print $1 ":" $2 }' "$work/$1.all" | sort -u >"$work/$1"
}

names=(start 1M 5M end)
execs=(0 1000000 5000000 "$total")
for i in "${!names[@]}"; do
    n=${names[$i]}
    [ "${execs[$i]}" -le "$total" ] || continue
    case $n in
        start) t=$start ;;
        end) t=$end ;;
        *) t=$(at "${execs[$i]}") ;;
    esac
    echo "== replaying the corpus at ${execs[$i]} executions ($(date -u -d "@$t" +%T))" >&2
    lines "$n" "$t"
done
[ -f "$work/1M" ] || cp "$work/end" "$work/1M"
[ -f "$work/5M" ] || cp "$work/end" "$work/5M"

# "a-b" ranges of consecutive lines, per file.
ranges() {
    sort -t: -k1,1 -k2,2n | awk -F: '
        $1 != f || $2 != l + 1 { if (f != "") out(); f = $1; a = $2 }
        { l = $2 }
        function out() { r[f] = r[f] (r[f] == "" ? "" : ", ") (a == l ? a : a "-" l) }
        END { if (f != "") out(); for (x in r) print "    " x " " r[x] }' | sort
}
new() { comm -13 "$work/$1" "$work/$2"; }
lost=$(comm -23 "$work/start" "$work/end" | wc -l)
printf '%s: %d lines of ours reached at the start, %d at the end (of %d instrumented in the files reached)\n' \
    "$target" "$(wc -l <"$work/start")" "$(wc -l <"$work/end")" \
    "$(awk -F: 'NR == FNR { seen[$1] = 1; next } $1 in seen && !n[$1 ":" $2]++' "$work/end" "$work/end.all" | wc -l)"
printf '  first reached by 1 M: %d; from 1 M to 5 M: %d; after 5 M: %d' \
    "$(new start 1M | wc -l)" "$(new 1M 5M | wc -l)" "$(new 5M end | wc -l)"
[ "$lost" = 0 ] && echo || echo " ($lost reached at the start and not at the end: a corpus minimised in place?)"
if [ "$(new 5M end | wc -l)" -gt 0 ]; then
    echo "  lines first reached after 5 M:"
    new 5M end | ranges
fi
if [ "$(new 1M 5M | wc -l)" -gt 0 ]; then
    echo "  lines first reached from 1 M to 5 M:"
    new 1M 5M | ranges
fi
