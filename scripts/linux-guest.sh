#!/usr/bin/env bash
# Builds the Linux guest that drives the model over vfio-user: Debian 12's
# 6.1 kernel with its own, unmodified mlx4_core/mlx4_ib/ib_core/ib_uverbs/
# ib_umad modules, busybox, and rdma-core's userspace (ibverbs-utils,
# ibverbs-providers with libmlx4, infiniband-diags, perftest, rdmacm-utils for
# rping, pciutils) with
# their libraries, packed into an initramfs. Prints the directory holding
# `vmlinuz` and `initrd.cpio.gz`.
#
#   scripts/linux-guest.sh            build if needed, print the directory
#   scripts/linux-guest.sh --check    exit 0 if built, print nothing
#
# Packages come from bookworm (and bookworm-security for the kernel) through a
# private apt configuration; the system's apt state is not touched. Cached
# under target/linux-guest; rebuilt only when this script changes.
#
# The guest's /init (written below) mounts proc, sys and devtmpfs, loads the
# stack (`mlx4_core mlx4_ib ib_umad ib_uverbs`; `autoload=0` on the kernel
# command line skips it), then either runs `run="cmd; cmd"` from the command
# line (each `;`-separated command through `sh -c`, echoed as `# cmd`, then
# `run: N of M commands failed`) and leaves through isa-debug-exit at port
# 0xf4 (QEMU status 33 when all succeeded, 35 otherwise: the same contract as
# our kernel's), or starts a shell on the console.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
top="$here/target/linux-guest"
out="$top/image"
check=0
[ "${1:-}" = --check ] && check=1

say() { printf '%s\n' "$*" >&2; }

stamp=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
if [ -f "$out/.ok" ] && [ "$(cat "$out/.ok")" = "$stamp" ] && [ -f "$out/initrd.cpio.gz" ]; then
    [ "$check" = 1 ] || echo "$out"
    exit 0
fi
[ "$check" = 1 ] && exit 1

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    say "linux-guest.sh: needs apt-get and dpkg-deb (Debian/Ubuntu)"; exit 1
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { say "linux-guest.sh: $keyring missing (apt-get install debian-archive-keyring)"; exit 1; }

apt_dir="$top/apt"
debs="$top/debs"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$debs"
cat > "$apt_dir/sources.list" <<EOF
deb [signed-by=$keyring] http://deb.debian.org/debian bookworm main
deb [signed-by=$keyring] http://deb.debian.org/debian-security bookworm-security main
EOF
: > "$apt_dir/status"
O=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
   -o "Dir::State::status=$apt_dir/status" -o Debug::NoLocking=1
   -o APT::Sandbox::User=root -o Acquire::Retries=3)

apt-get "${O[@]}" -q update >/dev/null
# The kernel: whatever linux-image-amd64 points at (6.1.0-N), pinned by the
# first build through the cached .deb.
kpkg=$(find "$debs" -maxdepth 1 -name 'linux-image-6.1.0-*-amd64_*.deb' -printf '%f\n' | sed -n 's/^\(linux-image-6\.1\.0-[0-9]*-amd64\)_.*/\1/p' | head -n 1)
if [ -z "$kpkg" ]; then
    deps=$(apt-cache "${O[@]}" depends linux-image-amd64)
    kpkg=$(sed -n 's/.*Depends: \(linux-image-6\.1\.0-[0-9]*-amd64\)$/\1/p' <<<"$deps" | head -n 1)
fi
[ -n "$kpkg" ] || { say "linux-guest.sh: cannot find the 6.1 kernel package"; exit 1; }
kver=${kpkg#linux-image-}

pkgs=("$kpkg" busybox-static kmod libkmod2 liblzma5 libzstd1 libssl3
      ibverbs-utils ibverbs-providers libibverbs1 librdmacm1 rdmacm-utils perftest
      infiniband-diags libibumad3 libibmad5 libibnetdisc5
      libnl-3-200 libnl-route-3-200 libc6 libgcc-s1 pciutils libpci3 pci.ids
      zlib1g libudev1)
missing=()
for p in "${pkgs[@]}"; do
    compgen -G "$debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "linux-guest.sh: downloading ${#missing[@]} Debian packages (about 90 MB, once)"
    (cd "$debs" && apt-get "${O[@]}" -q download "${missing[@]}" >/dev/null)
fi

work="$top/work"
rm -rf "$work"
mkdir -p "$work/x" "$work/root"
for p in "${pkgs[@]}"; do
    for d in "$debs/${p}"_*.deb; do dpkg-deb -x "$d" "$work/x"; done
done
x="$work/x"
r="$work/root"

# Userspace: binaries and the libraries they need (no perl: ibstat and
# friends are C programs; the perl scripts of infiniband-diags are left out).
mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,lib64,etc,proc,sys,dev,tmp,run,root}
cp -a "$x/bin/busybox" "$r/bin/busybox"
for b in ibv_devinfo ibv_devices ibv_rc_pingpong ibv_ud_pingpong ibstat ibstatus ibaddr ibportstate \
         perfquery smpquery sminfo ibping ibnetdiscover ibroute saquery \
         ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat ib_atomic_bw ib_atomic_lat \
         rping; do
    for d in usr/bin usr/sbin sbin bin; do
        if [ -e "$x/$d/$b" ]; then cp -a "$x/$d/$b" "$r/usr/bin/"; break; fi
    done
done
for d in bin sbin usr/bin usr/sbin; do
    [ -e "$x/$d/lspci" ] && cp -a "$x/$d/lspci" "$r/usr/bin/lspci"
done
cp -a "$x/usr/lib/x86_64-linux-gnu/." "$r/usr/lib/x86_64-linux-gnu/"
[ -d "$x/lib/x86_64-linux-gnu" ] && cp -a "$x/lib/x86_64-linux-gnu/." "$r/usr/lib/x86_64-linux-gnu/"
ln -sf ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$r/lib64/ld-linux-x86-64.so.2"
ln -s usr/lib "$r/lib"
# Drop what the guest never uses.
rm -rf "$r/usr/lib/x86_64-linux-gnu/"{gconv,engines-3,ossl-modules,audit} \
       "$r/usr/lib/x86_64-linux-gnu/"libssl*
mkdir -p "$r/etc/libibverbs.d" "$r/usr/share/misc"
cp -a "$x/etc/libibverbs.d/." "$r/etc/libibverbs.d/"
[ -e "$x/usr/share/misc/pci.ids" ] && cp -a "$x/usr/share/misc/pci.ids" "$r/usr/share/misc/"
echo "root:x:0:0:root:/root:/bin/sh" > "$r/etc/passwd"
echo "root:x:0:" > "$r/etc/group"

# Kernel and modules: only the InfiniBand stack, mlx4, and what they need.
cp "$x/boot/vmlinuz-$kver" "$out.vmlinuz.tmp" 2>/dev/null || { mkdir -p "$out"; cp "$x/boot/vmlinuz-$kver" "$out.vmlinuz.tmp"; }
km="$x/lib/modules/$kver"
mkdir -p "$r/lib/modules/$kver"
cp -a "$km/modules.order" "$km/modules.builtin" "$km/modules.builtin.modinfo" "$r/lib/modules/$kver/" 2>/dev/null || true
# e1000: the guests' Ethernet link for perftest's exchange of QP details;
# 8021q (and the 802/llc modules it needs): VLAN devices over mlx4_en.
(cd "$km" && find kernel/drivers/infiniband kernel/drivers/net/ethernet/mellanox/mlx4 \
     kernel/drivers/net/ethernet/intel/e1000 kernel/fs/configfs \
     kernel/net/8021q kernel/net/802 kernel/net/llc -name '*.ko') > "$work/mods"
while read -r m; do
    mkdir -p "$r/lib/modules/$kver/$(dirname "$m")"
    cp -a "$km/$m" "$r/lib/modules/$kver/$m"
done < "$work/mods"
# kmod's depmod from the same packages, run on the host against the tree.
ln -sf kmod "$x/bin/depmod"
LD_LIBRARY_PATH="$x/usr/lib/x86_64-linux-gnu:$x/lib/x86_64-linux-gnu" "$x/bin/depmod" -b "$r" "$kver"
# Every module named in modules.dep must be in the tree.
while read -r line; do
    for m in ${line#*:} ${line%%:*}; do
        [ -e "$r/lib/modules/$kver/$m" ] || { say "linux-guest.sh: $m is needed but not copied"; exit 1; }
    done
done < "$r/lib/modules/$kver/modules.dep"

for a in sh mount umount mkdir cat echo ls dmesg modprobe rmmod insmod lsmod poweroff sleep \
         grep sed head tail dd printf timeout seq test true false env uname ps kill wc tr cut setsid \
         ifconfig ip ping hostname awk nc cmp md5sum time; do
    ln -sf busybox "$r/bin/$a"
done

# Helpers for scripted runs (a `;` always separates --run's commands, so
# loops live here): `wait-active [SECS]` waits for mlx4_0 port 1 to become
# Active (default 60 s) and prints its LID and SM LID; `retry N CMD...` runs
# CMD up to N times, a second apart, until it succeeds (a perftest client
# started before its server listens).
cat > "$r/usr/bin/wait-active" <<'EOF'
#!/bin/sh
p=/sys/class/infiniband/mlx4_0/ports/1
n=${1:-60}
while [ "$n" -gt 0 ]; do
    case "$(cat $p/state 2>/dev/null)" in
        *ACTIVE*) echo "port 1 Active: LID $(cat $p/lid), SM LID $(cat $p/sm_lid)"; exit 0 ;;
    esac
    sleep 1; n=$((n - 1))
done
echo "wait-active: port 1 not Active after ${1:-60} s: $(cat $p/state 2>/dev/null)"
exit 1
EOF
cat > "$r/usr/bin/retry" <<'EOF'
#!/bin/sh
n=$1; shift
while :; do
    "$@" && exit 0
    n=$((n - 1))
    [ "$n" -gt 0 ] || { echo "retry: $1 failed every time"; exit 1; }
    sleep 1
done
EOF
chmod +x "$r/usr/bin/wait-active" "$r/usr/bin/retry"

# `peer-lid P [SECS]` prints the LID of the CA behind port P of the switch
# this guest's port 1 is cabled to (a directed-route PortInfo: cx3-vfu's
# node i is on port i+1), waiting up to SECS (default 90) for the SM to have
# given it one.
cat > "$r/usr/bin/peer-lid" <<'EOF'
#!/bin/sh
n=${2:-90}
while :; do
    lid=$(smpquery -D portinfo "0,1,$1" 2>/dev/null | sed -n 's/^Lid:\.*\([0-9]*\)$/\1/p')
    [ -n "$lid" ] && [ "$lid" != 0 ] && { echo "$lid"; exit 0; }
    n=$((n - 1))
    [ "$n" -gt 0 ] || { echo "peer-lid: no LID behind switch port $1" >&2; exit 1; }
    sleep 1
done
EOF
# `expect RE CMD...` runs CMD and succeeds only if its output matches the
# basic regular expression RE (ibping says 100% loss with status 0).
cat > "$r/usr/bin/expect" <<'EOF'
#!/bin/sh
re=$1; shift
out=$("$@" 2>&1); st=$?
printf '%s\n' "$out"
[ "$st" = 0 ] || exit "$st"
printf '%s\n' "$out" | grep -q -- "$re" || { echo "expect: no '$re' in the output of $1"; exit 1; }
EOF
chmod +x "$r/usr/bin/peer-lid" "$r/usr/bin/expect"

# `wait-down P [SECS]` waits (default 300 s) until port P of the switch this
# guest's port 1 is cabled to is Down: the guest there has powered off
# (cx3-vfu resets a function whose client has gone, which takes its link
# down). A guest that others query keeps itself up this way.
cat > "$r/usr/bin/wait-down" <<'EOF'
#!/bin/sh
n=${2:-300}
while [ "$n" -gt 0 ]; do
    smpquery -D portinfo 0,1 "$1" 2>/dev/null | grep -q '^LinkState:\.*Down' &&
        { echo "switch port $1 is Down"; exit 0; }
    sleep 1; n=$((n - 1))
done
echo "wait-down: switch port $1 still up after ${2:-300} s"
exit 1
EOF
chmod +x "$r/usr/bin/wait-down"

# The splitter of run="...": one command per line, split at the `;`s that
# are not inside quotes, parentheses, braces or a compound command
# (for/while/until/if/case ... done/fi/esac), so a loop stays one command.
mkdir -p "$r/usr/lib"
cat > "$r/usr/lib/run-split.awk" <<'EOF'
function word(w) {
    if (w ~ /^(for|while|until|if|case)$/) depth++
    else if (w ~ /^(done|fi|esac)$/ && depth > 0) depth--
}
{
    s = $0; n = length(s); cmd = ""; w = ""; q = ""
    for (i = 1; i <= n; i++) {
        c = substr(s, i, 1)
        if (q != "") { cmd = cmd c; if (c == q) q = ""; continue }
        if (c ~ /[A-Za-z0-9_]/) { w = w c; cmd = cmd c; continue }
        word(w); w = ""
        if (c == "'") q = c
        else if (c == "(" || c == "{") nest++
        else if ((c == ")" || c == "}") && nest > 0) nest--
        else if (c == ";" && depth == 0 && nest == 0) {
            # `;;` ends a case branch only inside a case (depth > 0).
            gsub(/^[ \t]+|[ \t]+$/, "", cmd); if (cmd != "") print cmd
            cmd = ""; continue
        }
        cmd = cmd c
    }
    word(w)
    gsub(/^[ \t]+|[ \t]+$/, "", cmd); if (cmd != "") print cmd
}
EOF

cat > "$r/init" <<'INIT'
#!/bin/sh
# The guest's init (scripts/linux-guest.sh).
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
# Kernel messages at warning and above reach the console; `dmesg` has the rest.
echo 4 > /proc/sys/kernel/printk
leave() { # status -> QEMU exits 33 (0) or 35 (else) through isa-debug-exit
    if [ "$1" = 0 ]; then v='\020'; else v='\021'; fi
    printf "$v" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
    poweroff -f
}
if [ "${autoload:-1}" != 0 ]; then
    for m in mlx4_core mlx4_ib ib_umad ib_uverbs; do
        modprobe "$m" || echo "init: modprobe $m failed"
    done
fi
# `ipaddr=A.B.C.D` (scripts/vfu-run.sh): the Ethernet link to the other
# Linux guest, for perftest's exchange of QP details.
if [ -n "${ipaddr:-}" ]; then
    modprobe e1000 && ifconfig lo 127.0.0.1 up &&
        ifconfig eth0 "$ipaddr" netmask 255.255.255.0 up ||
        echo "init: network $ipaddr not configured"
fi
echo "linux-guest: up ($(uname -r))"
if [ -n "${run:-}" ]; then
    total=0; failed=0
    printf '%s\n' "$run" | awk -f /usr/lib/run-split.awk > /tmp/run.cmds
    while IFS= read -r cmd; do
        total=$((total + 1))
        echo "# $cmd"
        sh -c "$cmd" </dev/null 2>&1 || { echo "(exit status $?)"; failed=$((failed + 1)); }
    done < /tmp/run.cmds
    echo "run: $failed of $total commands failed"
    leave "$failed"
fi
echo "linux-guest: shell on the console; 'poweroff -f' ends it"
setsid sh -c 'exec sh </dev/ttyS0 >/dev/ttyS0 2>&1'
leave 0
INIT
chmod +x "$r/init"

# The host has no cpio: busybox (the static one from the packages) packs it.
mkdir -p "$out"
(cd "$r" && find . | LC_ALL=C sort | "$x/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -6) > "$out/initrd.cpio.gz.tmp"
mv "$out/initrd.cpio.gz.tmp" "$out/initrd.cpio.gz"
mv "$out.vmlinuz.tmp" "$out/vmlinuz"
echo "$kver" > "$out/kernel-version"
rm -rf "$work"
echo "$stamp" > "$out/.ok"
say "linux-guest.sh: $kver guest, initramfs $(du -h "$out/initrd.cpio.gz" | cut -f1)"
echo "$out"
