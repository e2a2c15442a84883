#!/usr/bin/env bash
# Provides a QEMU with the vfio-user client (`-device vfio-user-pci`, QEMU
# 10.1 and later) and prints the path of a command that runs it.
#
#   scripts/qemu-vfu.sh            print the command (installing it if needed)
#   scripts/qemu-vfu.sh --check    exit 0 if one is already there, print nothing
#
# The system's qemu-system-x86_64 is used when it has the client. Otherwise
# (Debian 12 ships 7.2) trixie-backports' package and its dependency closure
# are downloaded with a private apt configuration (the system's apt state is
# not touched), unpacked under target/vfu-qemu/root, and run through trixie's
# own dynamic loader, since the binary needs a newer glibc than bookworm's.
# QEMU_MODULE_DIR points QEMU at its own modules first, so the system QEMU's
# modules (same directory, different build) are not loaded for what it uses;
# it replaces the bind mount of the recipe except for `-device help`, which
# loads every module QEMU knows of and so also reaches the system's
# (`-device vfio-user-pci,help` works). Idempotent:
# the downloads and the unpacked tree are cached under target/.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
top="$here/target/vfu-qemu"
wrapper="$top/qemu-system-x86_64"
# The version tested; if the archive has moved on, whatever trixie-backports
# offers is taken (and said).
PIN="1:11.1.3+ds-1~bpo13+1"
check=0
[ "${1:-}" = --check ] && check=1

say() { printf '%s\n' "$*" >&2; }

has_client() { # QEMU binary... -> 0 if it knows vfio-user-pci
    local opts
    opts=$("$@" -nodefaults -machine none -device vfio-user-pci,help 2>/dev/null) || return 1
    grep -q 'socket=' <<<"$opts"
}

if command -v qemu-system-x86_64 >/dev/null 2>&1 && has_client qemu-system-x86_64; then
    [ "$check" = 1 ] || command -v qemu-system-x86_64
    exit 0
fi
if [ -x "$wrapper" ] && [ -f "$top/.ok" ]; then
    [ "$check" = 1 ] || echo "$wrapper"
    exit 0
fi
[ "$check" = 1 ] && exit 1

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    say "qemu-vfu.sh: needs apt-get and dpkg-deb (Debian/Ubuntu) to fetch QEMU >= 10.1"; exit 1
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { say "qemu-vfu.sh: $keyring missing (apt-get install debian-archive-keyring)"; exit 1; }

apt_dir="$top/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
cat > "$apt_dir/sources.list" <<EOF
deb [signed-by=$keyring] http://deb.debian.org/debian trixie main
deb [signed-by=$keyring] http://deb.debian.org/debian trixie-backports main
EOF
: > "$apt_dir/status"
O=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
   -o "Dir::State::status=$apt_dir/status" -o Debug::NoLocking=1
   -o APT::Sandbox::User=root -o Acquire::Retries=3)

say "qemu-vfu.sh: fetching QEMU with the vfio-user client from trixie-backports (about 40 MB, once)"
apt-get "${O[@]}" -q update >/dev/null
want="qemu-system-x86=$PIN"
versions=$(apt-cache "${O[@]}" madison qemu-system-x86)
if ! grep -qF "$PIN" <<<"$versions"; then
    say "qemu-vfu.sh: $PIN is gone from the archive; taking trixie-backports' current qemu-system-x86"
    want="qemu-system-x86"
fi
apt-get "${O[@]}" -q -y --no-install-recommends --download-only -t trixie-backports install "$want" >/dev/null

root="$top/root"
rm -rf "$root.new"
mkdir -p "$root.new"
for deb in "$apt_dir"/cache/archives/*.deb; do
    dpkg-deb -x "$deb" "$root.new"
done
rm -rf "$root"
mv "$root.new" "$root"

ld="$root/usr/lib64/ld-linux-x86-64.so.2"
[ -e "$ld" ] || ld="$root/lib64/ld-linux-x86-64.so.2"
[ -e "$ld" ] || { say "qemu-vfu.sh: no dynamic loader in the unpacked packages"; exit 1; }
mods=$(ls -d "$root"/usr/lib/x86_64-linux-gnu/qemu 2>/dev/null || true)
cat > "$wrapper" <<EOF
#!/bin/sh
# QEMU from trixie-backports, run through its own loader (scripts/qemu-vfu.sh).
export QEMU_MODULE_DIR="$mods"
exec "$ld" --library-path "$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu" \\
    "$root/usr/bin/qemu-system-x86_64" -L "$root/usr/share/qemu" -L "$root/usr/share/seabios" "\$@"
EOF
chmod +x "$wrapper"
if ! has_client "$wrapper"; then
    say "qemu-vfu.sh: the unpacked QEMU does not offer vfio-user-pci:"
    "$wrapper" --version >&2 || true
    exit 1
fi
touch "$top/.ok"
# The downloaded archives are no longer needed once unpacked.
rm -f "$apt_dir"/cache/archives/*.deb "$apt_dir"/cache/*.bin
say "qemu-vfu.sh: $("$wrapper" --version | head -n 1)"
echo "$wrapper"
