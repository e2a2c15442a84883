# Installs what building and booting the image needs, on a fresh Debian or
# Ubuntu machine; elsewhere it says what is missing. Sourced by run-qemu.sh
# and run-tests.sh.

TOOLCHAIN=1.95.0

say() { printf '%s\n' "$*" >&2; }

ensure_rust() {
    if ! command -v rustup >/dev/null 2>&1; then
        say "error: rustup not found; install Rust from https://rustup.rs (toolchain $TOOLCHAIN)"
        return 1
    fi
    if ! rustup toolchain list | grep -q "^$TOOLCHAIN"; then
        rustup toolchain install "$TOOLCHAIN" --profile minimal --component rust-src,clippy,rustfmt >&2 || return 1
    fi
    local have
    have=$(rustup component list --installed --toolchain "$TOOLCHAIN" 2>/dev/null)
    for c in rust-src clippy rustfmt; do
        grep -q "^$c" <<<"$have" || rustup component add "$c" --toolchain "$TOOLCHAIN" >&2 || return 1
    done
}

# apt_install PACKAGE... installs with apt-get when root (updating the package
# lists only if the first try fails); otherwise says what to install.
apt_install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing $* with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 && return 0
        apt-get update -q >/dev/null 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
    else
        say "error: missing $*; install them (Debian/Ubuntu: sudo apt-get install $*)"
        return 1
    fi
}

# ensure_pkgs CMD:PACKAGE ... installs PACKAGE when CMD is missing.
ensure_pkgs() {
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

ensure_qemu() { ensure_pkgs qemu-system-x86_64:qemu-system-x86; }

ensure_iso_tools() {
    ensure_pkgs xorriso:xorriso mformat:mtools grub-mkrescue:grub-common || return 1
    # grub-mkrescue needs the BIOS platform files from grub-pc-bin.
    [ -d /usr/lib/grub/i386-pc ] || apt_install grub-pc-bin
}

# ensure_vfu fetches what the vfio-user QEMU tests need (docs/vfio-user.md):
# a QEMU with the vfio-user client and the Linux guest initramfs, both cached
# under target/ (about 130 MB of Debian packages on the first run, then
# nothing).
ensure_vfu() {
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    "$here/scripts/qemu-vfu.sh" >/dev/null || return 1
    "$here/scripts/linux-guest.sh" >/dev/null || return 1
}

# tshark dissects the fabric's packet captures in the sim tests; without it
# those tests say loudly that they skipped the dissection.
ensure_tshark() {
    ensure_pkgs tshark:tshark || say "warning: tshark could not be installed; the capture tests will skip dissecting"
}

# Real InfiniBand peers for the fabric: OpenSM, infiniband-diags, the
# umad2sim preload (a package of its own) and ibsim (the reference the
# peers tests measure against). Without them the peers tests say loudly
# that they skipped, and run-qemu.sh cannot start OpenSM.
ensure_ib_peers() {
    local missing=()
    command -v opensm >/dev/null 2>&1 || [ -x /usr/sbin/opensm ] || missing+=(opensm)
    command -v ibnetdiscover >/dev/null 2>&1 || [ -x /usr/sbin/ibnetdiscover ] || missing+=(infiniband-diags)
    [ -e /usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so ] || missing+=(libumad2sim0)
    command -v ibsim >/dev/null 2>&1 || missing+=(ibsim-utils)
    [ ${#missing[@]} -eq 0 ] && return 0
    apt_install "${missing[@]}" || say "warning: ${missing[*]} could not be installed; the OpenSM and diags tests will skip"
}

# cargo-fuzz (the libFuzzer driver of fuzz/), from crates.io into
# target/tools, once; scripts/fuzz.sh puts it on PATH.
ensure_cargo_fuzz() {
    local here root
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    root="$here/target/tools"
    export PATH="$root/bin:$PATH"
    command -v cargo-fuzz >/dev/null 2>&1 && return 0
    say "installing cargo-fuzz into target/tools (crates.io)"
    cargo install cargo-fuzz --locked --quiet --root "$root" >&2 || {
        say "error: cargo install cargo-fuzz failed"
        return 1
    }
}
