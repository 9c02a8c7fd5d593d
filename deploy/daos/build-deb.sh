#!/usr/bin/env bash
# Pack the DAOS client stack as the Debian package daos-client_VERSION-1_ARCH.deb.
#
#   deploy/daos/build-deb.sh ARCH TREE OUT_DIR [COMPRESSION]
#
#   ARCH         amd64 or arm64 (the Debian name); every ELF file in TREE must be for it
#   TREE         a DAOS install tree: the directory holding bin/daos, lib64/libdfs.so and
#                prereq/release/. Made by deploy/daos/build-daos-client.sh, or the prebuilt
#                ones of ../shared/daos unpacked (daos-client-*-arm64.tar.zst: daos-arm64/;
#                daos-*-amd64.tar.zst: daos/, client and server, of which only the client
#                files are taken)
#   OUT_DIR      the package is written here
#   COMPRESSION  dpkg-deb -Z: xz (default), gzip (./x test: sooner), zstd or none
#
# The package holds the client only: /usr/lib/daos/{bin,lib64,include} and prereq/release/
# {ofi,mercury,argobots,isal,isal_crypto}/lib64 (mercury's NA plugins included) as the tree has
# them ($ORIGIN run paths), /usr/bin/{daos,daos_agent,dfuse,dmg} links into it, daos.pc in
# /usr/lib/TRIPLET/pkgconfig, /etc/daos/daos_agent.yml (a conffile) and daos_agent.service (its
# own system user daos_agent, made by postinst). Nothing of the server: a file of it in the
# package is an error. Depends: comes from dpkg-shlibdeps over every ELF file (the package's
# own libraries are found through their run paths and need no dependency); for arm64 the arm64
# runtime libraries must be installed (multiarch; as root this script installs them).
# Reproducible: the same tree gives the same bytes (SOURCE_DATE_EPOCH: the newest file of the
# tree unless set; mtimes clamped, names sorted, root ownership).
set -euo pipefail

die() { printf 'build-deb: %s\n' "$*" >&2; exit 1; }
if (($# < 3 || $# > 4)); then
    sed -n '2,25p' "$0" >&2
    exit 2
fi
ARCH=$1 TREE=${2%/} OUT_DIR=$3 COMPRESSION=${4:-xz}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case "$ARCH" in
    amd64) TRIPLET=x86_64-linux-gnu ELF_MACHINE=x86-64 ;;
    arm64) TRIPLET=aarch64-linux-gnu ELF_MACHINE="ARM aarch64" ;;
    *) die "ARCH is amd64 or arm64, not '$ARCH'" ;;
esac
case "$COMPRESSION" in
    xz | gzip | zstd | none) ;;
    *) die "COMPRESSION is xz, gzip, zstd or none, not '$COMPRESSION'" ;;
esac
[ -d "$TREE" ] || die "TREE $TREE is not a directory"
for f in bin/daos bin/daos_agent bin/dmg bin/dfuse lib64/libdfs.so lib64/libdaos.so lib64/libgurt.so \
    lib64/daos/VERSION prereq/release/mercury/lib64; do
    [ -e "$TREE/$f" ] || die "$TREE/$f is missing: TREE must be a DAOS install tree (the directory holding bin/, lib64/ and prereq/; for the ../shared/daos tarballs the daos-arm64/ or daos/ directory they unpack to)"
done
UPSTREAM=$(tr -d ' \n' <"$TREE/lib64/daos/VERSION")
[[ $UPSTREAM =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "$TREE/lib64/daos/VERSION holds '$UPSTREAM', not a version"
VERSION=$UPSTREAM-1
# The newest file of the tree: the same tree packs to the same bytes.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(find "$TREE" -printf '%T@\n' | sort -n | tail -1 | cut -d. -f1)}
export SOURCE_DATE_EPOCH

# The arm64 runtime libraries dpkg-shlibdeps reads (their symbols/shlibs files), for ARCH.
RUNTIME=(libc6 libgcc-s1 libstdc++6 libuuid1 libyaml-0-2 libhwloc15 libjson-c5 libssl3 libprotobuf-c1 libnuma1
    liblz4-1 libaio1 libcapstone4 libunwind8 libucx0 libibverbs1 librdmacm1)
missing=()
for p in "${RUNTIME[@]}"; do
    dpkg-query -W -f='${Status}' "$p:$ARCH" 2>/dev/null | grep -q "install ok installed" || missing+=("$p:$ARCH")
done
for tool in dpkg-shlibdeps:dpkg-dev patchelf:patchelf file:file; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
    [ "$(id -u)" = 0 ] || die "missing: ${missing[*]} (apt-get install them; for arm64 after dpkg --add-architecture arm64)"
    if [ "$ARCH" != "$(dpkg --print-architecture)" ] && ! dpkg --print-foreign-architectures | grep -qx "$ARCH"; then
        dpkg --add-architecture "$ARCH"
    fi
    echo "build-deb: installing ${missing[*]}" >&2
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# dpkg-shlibdeps finds the package root by its DEBIAN directory ($ORIGIN run paths resolve
# inside it, and libraries there need no dependency) and reads debian/control.
SRC=$WORK/src
PKG=$SRC/debian/daos-client
D=$PKG/usr/lib/daos
mkdir -p "$PKG/DEBIAN" "$D"
printf 'Source: daos-client\n\nPackage: daos-client\nArchitecture: any\n' >"$SRC/debian/control"

# ---- the client files of TREE ----
# copy PATH...: paths relative to TREE (files, links or directories), into $D
copy() {
    (cd "$TREE" && cp -a --parents "$@" "$D/")
}
CLIENT_TOOLS=(daos daos_agent dmg dfuse cart_ctl self_test)
for t in "${CLIENT_TOOLS[@]}"; do
    [ ! -e "$TREE/bin/$t" ] || copy "bin/$t"
done
# lib64: every library there but the server's (the amd64 tree of ../shared/daos has both);
# daos_srv/ and the rest of lib64's subdirectories are not taken.
SERVER_LIBS='^lib(daos_common_pmem|dav(_v2)?|vos|bio|ddb)\.so'
(cd "$TREE" && find lib64 -maxdepth 1 \( -type f -o -type l \) -name 'lib*.so*' -printf '%f\n') | sort |
    while IFS= read -r lib; do
        [[ $lib =~ $SERVER_LIBS ]] || copy "lib64/$lib"
    done
copy lib64/daos/VERSION
[ ! -e "$TREE/lib64/daos/API_VERSION" ] || copy lib64/daos/API_VERSION
[ ! -d "$TREE/lib64/daos/certgen" ] || copy lib64/daos/certgen
[ ! -e "$TREE/share/daos/ioil-ld-opts" ] || copy share/daos/ioil-ld-opts
# The DAOS headers (include/daos_srv, if a tree has it, is the server's).
(cd "$TREE" && find include -name daos_srv -prune -o \( -type f -o -type l \) -print | sort) |
    while IFS= read -r h; do copy "$h"; done
# The prerequisites: their libraries and (libfabric, mercury) their diagnostic tools.
for c in ofi mercury argobots isal isal_crypto; do
    [ -d "$TREE/prereq/release/$c/lib64" ] || die "$TREE/prereq/release/$c/lib64 is missing"
    (cd "$TREE" && find "prereq/release/$c/lib64" \( -type f -o -type l \) -name '*.so*' | sort) |
        while IFS= read -r f; do copy "$f"; done
done
for b in ofi/bin/fi_info ofi/bin/fi_pingpong ofi/bin/fi_strerror mercury/bin/hg_info; do
    [ ! -e "$TREE/prereq/release/$b" ] || copy "prereq/release/$b"
done
ls "$D"/prereq/release/mercury/lib64/mercury/libna_plugin_*.so >/dev/null 2>&1 ||
    die "$TREE has no mercury NA plugins (prereq/release/mercury/lib64/mercury/libna_plugin_*.so)"

# ---- what makes it a Debian package ----
install -d "$PKG/usr/bin" "$PKG/usr/lib/$TRIPLET/pkgconfig" "$PKG/etc/daos" "$PKG/lib/systemd/system" \
    "$PKG/usr/share/doc/daos-client/examples" "$PKG/usr/share/bash-completion/completions"
for t in daos daos_agent dfuse dmg; do
    ln -s "../lib/daos/bin/$t" "$PKG/usr/bin/$t"
done
cat >"$PKG/usr/lib/$TRIPLET/pkgconfig/daos.pc" <<EOF
# The DAOS client libraries of the package daos-client (built by dpuio). daos_types.h includes
# <uuid/uuid.h>: compiling against the headers needs uuid-dev.
prefix=/usr/lib/daos
libdir=\${prefix}/lib64
includedir=\${prefix}/include

Name: daos
Description: DAOS client: libdfs (POSIX namespace), libdaos, libgurt
Version: $UPSTREAM
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ldfs -ldaos -lgurt
Cflags: -I\${includedir}
EOF
install -m 0644 "$HERE/daos_agent.yml" "$PKG/etc/daos/daos_agent.yml"
install -m 0644 "$HERE/daos_agent.service" "$PKG/lib/systemd/system/daos_agent.service"
install -m 0644 "$HERE/copyright" "$PKG/usr/share/doc/daos-client/copyright"
for y in daos_agent.yml daos_control.yml; do
    [ ! -f "$TREE/etc/$y" ] || install -m 0644 "$TREE/etc/$y" "$PKG/usr/share/doc/daos-client/examples/$y"
done
[ ! -f "$TREE/etc/bash_completion.d/daos.bash" ] ||
    install -m 0644 "$TREE/etc/bash_completion.d/daos.bash" "$PKG/usr/share/bash-completion/completions/daos"
for t in "${CLIENT_TOOLS[@]}"; do
    [ -f "$TREE/share/man/man8/$t.8" ] || continue
    install -d "$PKG/usr/share/man/man8"
    gzip -9nc "$TREE/share/man/man8/$t.8" >"$PKG/usr/share/man/man8/$t.8.gz"
done
echo /etc/daos/daos_agent.yml >"$PKG/DEBIAN/conffiles"
for s in postinst prerm postrm; do
    install -m 0755 "$HERE/daos-client.$s" "$PKG/DEBIAN/$s"
done

# ---- checks: nothing of the server, every ELF for ARCH, run paths inside the package ----
server=$(find "$PKG" -printf '/%P\n' | grep -E 'daos_server|daos_engine|daos_srv|spdk|dpdk|librte_|pmdk|libpmem|libdav|/ddb|/dlck|daos_metrics|libvos|libbio' || true)
[ -z "$server" ] || die "server files in the package: $(tr '\n' ' ' <<<"$server")"
is_elf() { [ "$(head -c4 "$1" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; }
ELFS=()
while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    file -b "$f" | grep -q "$ELF_MACHINE" || die "${f#"$PKG"} is not a $ARCH ELF file: $(file -b "$f")"
    sections=$(readelf -S "$f")
    ! grep -q ' \.debug_info ' <<<"$sections" || die "${f#"$PKG"} is not stripped (it has .debug_info)"
    # Absolute run path entries (the amd64 tree of ../shared/daos has /opt/daos/... ones) become
    # $ORIGIN-relative where they name a directory of the tree, and are dropped otherwise:
    # installed, the package uses its own files only.
    rp=$(patchelf --print-rpath "$f")
    # shellcheck disable=SC2016 # $ORIGIN is literal
    keep=$(tr ':' '\n' <<<"$rp" | while IFS= read -r e; do
        case "$e" in
            '' ) ;;
            '$ORIGIN'*) echo "$e" ;;
            */lib64 | */prereq/release/*)
                rest=${e#/}
                while [ -n "$rest" ]; do
                    if [[ $rest == lib64 || $rest == prereq/release/* ]] && [ -d "$D/$rest" ]; then
                        rel=$(realpath -m --relative-to="$(dirname "$f")" "$D/$rest")
                        [ "$rel" = . ] && echo '$ORIGIN' || echo "\$ORIGIN/$rel"
                        break
                    fi
                    [[ $rest == */* ]] || break
                    rest=${rest#*/}
                done ;;
        esac
    done | awk '!seen[$0]++' | paste -sd:)
    if [ "$keep" != "$rp" ]; then
        echo "${f#"$PKG"}: $rp -> ${keep:-(none)}" >>"$WORK/runpaths"
        if [ -n "$keep" ]; then patchelf --set-rpath "$keep" "$f"; else patchelf --remove-rpath "$f"; fi
    fi
    ELFS+=("$f")
done < <(find "$PKG/usr" -type f -print0 | sort -z)
((${#ELFS[@]})) || die "no ELF file in the package"
if [ -s "$WORK/runpaths" ]; then
    echo "build-deb: $(wc -l <"$WORK/runpaths") files had run paths outside the tree: made \$ORIGIN-relative, e.g." \
        "$(head -n1 "$WORK/runpaths")" >&2
fi
# Every tool and library finds what it needs in the package or the system (its run paths
# resolve inside the package as they will under /usr/lib/daos). Mercury's plugins are left
# out: libna, which loads them, provides their libna.so.6.
if [ "$ARCH" = arm64 ]; then
    LIST=(qemu-aarch64-static "/usr/lib/$TRIPLET/ld-linux-aarch64.so.1" --list)
else
    LIST=(/lib64/ld-linux-x86-64.so.2 --list)
fi
command -v "${LIST[0]}" >/dev/null || die "${LIST[0]} is missing (apt-get install qemu-user-static)"
for f in "$D"/bin/* "$D"/lib64/*.so "$D"/prereq/release/*/lib64/*.so.*; do
    if [ -L "$f" ] || [ ! -f "$f" ]; then continue; fi
    out=$(env -u LD_LIBRARY_PATH "${LIST[@]}" "$f" 2>&1) || die "${f#"$PKG"}: the loader cannot list it: $out"
    ! grep -q 'not found' <<<"$out" || die "${f#"$PKG"}: $(grep 'not found' <<<"$out" | tr -s ' \t\n' ' ')"
done

# ---- normalise: modes, times ----
find "$PKG" -type d -exec chmod 0755 {} +
find "$PKG/usr" "$PKG/etc" "$PKG/lib" -type f -exec chmod 0644 {} +
chmod 0755 "$D"/bin/* "$D"/prereq/release/*/bin/* 2>/dev/null || true
[ ! -e "$D/lib64/daos/certgen/gen_certificates.sh" ] || chmod 0755 "$D/lib64/daos/certgen/gen_certificates.sh"

# ---- Depends: dpkg-shlibdeps over every ELF file ----
# The package's own library directories are searched too (found there, a library needs no
# dependency): mercury's NA plugins need libna without a run path to it, since libna is what
# loads them.
private=()
while IFS= read -r dir; do private+=("-l/${dir#"$PKG/"}"); done < <(find "$D" -name '*.so*' -printf '%h\n' | sort -u)
shlibs=$(cd "$SRC" && DEB_HOST_ARCH=$ARCH DEB_HOST_MULTIARCH=$TRIPLET dpkg-shlibdeps -O \
    -l"/usr/lib/$TRIPLET" -l"/lib/$TRIPLET" "${private[@]}" "${ELFS[@]#"$SRC/"}" 2>"$WORK/shlibdeps.log") || {
    cat "$WORK/shlibdeps.log" >&2
    die "dpkg-shlibdeps failed for $ARCH (are the $ARCH runtime libraries installed? ${RUNTIME[*]})"
}
depends="$(sed -n 's/^shlibs:Depends=//p' <<<"$shlibs"), adduser"

size=$(find "$PKG" -path "$PKG/DEBIAN" -prune -o -type f -printf '%s\n' | awk '{ k += int(($1 + 1023) / 1024) } END { print k }')
cat >"$PKG/DEBIAN/control" <<EOF
Package: daos-client
Version: $VERSION
Architecture: $ARCH
Maintainer: dpuio developers <dpuio@localhost>
Installed-Size: $size
Depends: $depends
Suggests: uuid-dev
Section: net
Priority: optional
Homepage: https://daos.io
Description: DAOS client: libdaos, libdfs, daos_agent and the daos tool
 The client side of DAOS $UPSTREAM (daos-stack/daos), built from source by dpuio for Debian
 and Ubuntu: the libraries (libdaos, libdfs, libgurt, libcart, libduns, the interception
 libraries libioil and libpil4dfs) with their headers and pkg-config file (daos.pc), the
 daos_agent daemon with a hardened systemd unit, and the daos, dmg and dfuse tools. DAOS's
 own builds of libfabric (tcp, rxm, shm, sockets and, where built, verbs), mercury,
 argobots, isa-l and isa-l_crypto are private to it, under /usr/lib/daos.
EOF
(cd "$PKG" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$PKG/DEBIAN/md5sums"
chmod 0644 "$PKG/DEBIAN/control" "$PKG/DEBIAN/md5sums" "$PKG/DEBIAN/conffiles"
find "$PKG" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

OUT=$OUT_DIR/daos-client_${VERSION}_$ARCH.deb
dpkg-deb --root-owner-group --threads-max=1 -Z"$COMPRESSION" --build "$PKG" "$OUT" >/dev/null
echo "$OUT"
