#!/usr/bin/env bash
# Build dpuio's Debian packages for one architecture from binaries that are already built.
#
#   deploy/debian/build-debs.sh ARCH BIN_DIR VERSION OUT_DIR [COMPRESSION] [WHICH]
#
#   ARCH         amd64 or arm64 (the Debian name)
#   BIN_DIR      where cargo put dpu-agent, dpuctl, dpuio, dpuio-bench, dpuio-bench-agent, libdpuio.so and libdpuio.a
#   VERSION      the workspace version (Cargo.toml)
#   OUT_DIR      the packages are written here
#   COMPRESSION  dpkg-deb -Z (default xz; ./x test passes gzip: the same package, sooner)
#   WHICH        all (default) or agent: only dpuio-agent, from dpu-agent and dpuctl alone
#                (what the OCI image needs; ./x test builds it from the debug build)
#
# Writes dpuio-agent_VERSION_ARCH.deb (dpu-agent, dpuctl, the systemd unit, the config as a
# conffile, a system user) and dpuio-host_VERSION_ARCH.deb (dpuio, dpuio-bench and dpuio-bench-agent, which
# `dpuio bench` runs, libdpuio.so/.a, dpuio.h, dpuio.pc). Binaries are stripped (with the
# cross binutils for arm64). Depends: comes from dpkg-shlibdeps over the binaries, so it
# names the UCX and libc packages the binaries really link. libfabric is loaded at run time
# (dlopen, for the ofi transports), so it is recommended: libfabric1, and for dpuio-agent
# daos-client (the DAOS backend's libraries, their libfabric and daos_agent, which
# ./x package also builds). `./x package` calls this for both architectures.
set -euo pipefail

if (($# < 4)); then
    sed -n '2,19p' "$0" >&2
    exit 2
fi
ARCH=$1 BIN_DIR=$2 VERSION=$3 OUT_DIR=$4 COMPRESSION=${5:-xz} WHICH=${6:-all}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
case "$ARCH" in
    amd64) TRIPLET=x86_64-linux-gnu STRIP=strip ;;
    arm64) TRIPLET=aarch64-linux-gnu STRIP=aarch64-linux-gnu-strip ;;
    *) echo "build-debs: unknown architecture $ARCH (amd64 or arm64)" >&2; exit 2 ;;
esac
case "$WHICH" in
    all) NEEDED=(dpu-agent dpuctl dpuio dpuio-bench dpuio-bench-agent libdpuio.so libdpuio.a) ;;
    agent) NEEDED=(dpu-agent dpuctl) ;;
    *) echo "build-debs: WHICH is all or agent, not $WHICH" >&2; exit 2 ;;
esac
for f in "${NEEDED[@]}"; do
    [ -f "$BIN_DIR/$f" ] || { echo "build-debs: $BIN_DIR/$f is missing: build it first (./x package does)" >&2; exit 1; }
done
command -v "$STRIP" >/dev/null || { echo "build-debs: $STRIP is missing (apt-get install binutils-$TRIPLET)" >&2; exit 1; }
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# dpkg-shlibdeps reads debian/control of a source package; this one exists only here.
shlibdeps() {  # shlibdeps FILE...: prints the Depends: value for the binaries
    local src="$WORK/src" out
    mkdir -p "$src/debian"
    printf 'Source: dpuio\n\nPackage: dpuio\nArchitecture: any\n' >"$src/debian/control"
    out=$(cd "$src" && DEB_HOST_ARCH=$ARCH DEB_HOST_MULTIARCH=$TRIPLET dpkg-shlibdeps -O \
        -l"/usr/lib/$TRIPLET" -l"/lib/$TRIPLET" "$@" 2>"$WORK/shlibdeps.log") || {
        cat "$WORK/shlibdeps.log" >&2
        echo "build-debs: dpkg-shlibdeps failed for $ARCH (are the $ARCH runtime libraries installed? ./x package installs them)" >&2
        exit 1
    }
    sed -n 's/^shlibs:Depends=//p' <<<"$out"
}

control() {  # control NAME DEPENDS RECOMMENDS DESCRIPTION... > DEBIAN/control (RECOMMENDS may be empty)
    local name=$1 depends=$2 recommends=$3 size
    shift 3
    size=$(du -sk --exclude=DEBIAN "$WORK/$name" | cut -f1)
    cat <<EOF
Package: $name
Version: $VERSION
Architecture: $ARCH
Maintainer: dpuio developers <dpuio@localhost>
Installed-Size: $size
Depends: $depends
${recommends:+Recommends: $recommends
}Section: net
Priority: optional
Description: $1
EOF
    shift
    local line
    for line in "$@"; do
        printf ' %s\n' "$line"
    done
}

build() {  # build NAME: DEBIAN/control is in place
    local name=$1
    find "$WORK/$name" -path "$WORK/$name/DEBIAN" -prune -o -type f -print0 | sort -z |
        xargs -0 md5sum | sed "s|$WORK/$name/||" >"$WORK/$name/DEBIAN/md5sums"
    dpkg-deb --root-owner-group -Z"$COMPRESSION" --build "$WORK/$name" "$OUT_DIR/${name}_${VERSION}_${ARCH}.deb" >/dev/null
    echo "$OUT_DIR/${name}_${VERSION}_${ARCH}.deb"
}

# dpuio-agent: the agent and dpuctl, its unit, its config.
A="$WORK/dpuio-agent"
install -d "$A/DEBIAN" "$A/usr/bin" "$A/lib/systemd/system" "$A/etc/dpuio" "$A/usr/share/doc/dpuio-agent"
install -m 0755 "$BIN_DIR/dpu-agent" "$BIN_DIR/dpuctl" "$A/usr/bin/"
"$STRIP" --strip-unneeded "$A/usr/bin/dpu-agent" "$A/usr/bin/dpuctl"
install -m 0644 "$ROOT/deploy/systemd/dpu-agent.service" "$A/lib/systemd/system/"
install -m 0640 "$ROOT/deploy/config/agent.toml" "$A/etc/dpuio/agent.toml"
install -m 0644 "$ROOT/README.md" "$A/usr/share/doc/dpuio-agent/README.md"
echo /etc/dpuio/agent.toml >"$A/DEBIAN/conffiles"
install -m 0755 "$HERE/dpuio-agent.postinst" "$A/DEBIAN/postinst"
install -m 0755 "$HERE/dpuio-agent.prerm" "$A/DEBIAN/prerm"
install -m 0755 "$HERE/dpuio-agent.postrm" "$A/DEBIAN/postrm"
# UCX is loaded at run time too (libucp.so.0, no DT_NEEDED names it), but it is the
# default transport: required, at the oldest UCX whose UCP calls we make (ucx-sys/build.rs).
depends="$(shlibdeps "$A/usr/bin/dpu-agent" "$A/usr/bin/dpuctl"), libucx0 (>= 1.10), adduser"
# The DAOS backend loads libdaos/libdfs at run time (from /usr/lib/daos/lib64, where the
# daos-client package ./x package builds puts them) and talks to its daos_agent; without
# it the agent serves its embedded local backend. The ofi transports load libfabric.so.1
# at run time: DAOS's when the DAOS backend has loaded it, else the loader's (libfabric1);
# without one the agent offers UCX alone. So: recommended, not required.
control dpuio-agent "$depends" "daos-client, libfabric1" \
    "dpuio agent: DAOS client and RDMA data plane for BlueField DPUs" \
    "dpu-agent serves the dpuio control plane (gRPC over mutual TLS) and moves file" \
    "data into host memory with one-sided UCX/RDMA operations, so no host CPU is on" \
    "the data path. dpuctl is its operator's command line." >"$A/DEBIAN/control"
build dpuio-agent
[ "$WHICH" = all ] || exit 0

# dpuio-host: the host CLI and its benchmarks (dpuio bench runs dpuio-bench from beside
# dpuio, and dpuio-bench runs dpuio-bench-agent from beside itself for the libdfs
# baseline and the crypto benchmark), the C library, its header and pkg-config file.
H="$WORK/dpuio-host"
install -d "$H/DEBIAN" "$H/usr/bin" "$H/usr/lib/$TRIPLET/pkgconfig" "$H/usr/include" "$H/usr/share/doc/dpuio-host"
install -m 0755 "$BIN_DIR/dpuio" "$BIN_DIR/dpuio-bench" "$BIN_DIR/dpuio-bench-agent" "$H/usr/bin/"
install -m 0644 "$BIN_DIR/libdpuio.so" "$BIN_DIR/libdpuio.a" "$H/usr/lib/$TRIPLET/"
"$STRIP" --strip-unneeded "$H/usr/bin/dpuio" "$H/usr/bin/dpuio-bench" "$H/usr/bin/dpuio-bench-agent" \
    "$H/usr/lib/$TRIPLET/libdpuio.so"
"$STRIP" --strip-debug "$H/usr/lib/$TRIPLET/libdpuio.a"
install -m 0644 "$ROOT/host-shim/capi/include/dpuio.h" "$H/usr/include/"
install -m 0644 "$ROOT/README.md" "$H/usr/share/doc/dpuio-host/README.md"
# What `cargo rustc --print native-static-libs` lists for libdpuio.a goes to Libs.private.
cat >"$H/usr/lib/$TRIPLET/pkgconfig/dpuio.pc" <<EOF
prefix=/usr
libdir=\${prefix}/lib/$TRIPLET
includedir=\${prefix}/include

Name: dpuio
Description: dpuio host library: attach to a dpuio agent, read and write files through registered memory
Version: $VERSION
Libs: -L\${libdir} -ldpuio
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl
Cflags: -I\${includedir}
EOF
# libucx0: loaded at run time (the first UCX transport), the default transport.
depends="$(shlibdeps "$H/usr/bin/dpuio" "$H/usr/bin/dpuio-bench" "$H/usr/bin/dpuio-bench-agent" "$H/usr/lib/$TRIPLET/libdpuio.so"), libucx0 (>= 1.10)"
# The ofi transports (dlopen of libfabric.so.1); UCX alone without it.
control dpuio-host "$depends" "libfabric1" \
    "dpuio host side: CLI, benchmarks, C library and header" \
    "dpuio attaches a host process to a dpuio agent on a DPU; the agent moves file data" \
    "into the process's registered memory. This package holds the dpuio command (and" \
    "dpuio-bench and dpuio-bench-agent, its bench subcommand), the C library libdpuio (shared and static)," \
    "dpuio.h and its pkg-config file." >"$H/DEBIAN/control"
build dpuio-host
