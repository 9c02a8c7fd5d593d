#!/usr/bin/env python3
"""Build the dpu-agent OCI image from the dpuio-agent Debian package, with no registry.

  deploy/image/build-oci.py --arch ARCH --deb DEB --version VERSION --out FILE [options]

  --arch ARCH          amd64 or arm64 (the Debian name; the image's `architecture`)
  --deb DEB            dpuio-agent_VERSION_ARCH.deb from deploy/debian/build-debs.sh
  --version VERSION    the workspace version (the image tag)
  --out FILE           the OCI archive to write (an OCI image layout in a tar file)
  --sysroot DIR        where the ARCH runtime libraries are installed (default /: Debian's
                       multiarch /usr/lib/<triplet>, e.g. libucx0:arm64 beside the amd64 one)
  --name NAME          the image name without tag (default localhost/dpuio/dpu-agent)
  --ibverbs-providers  comma-separated libibverbs providers to include (default mlx5, the
                       BlueField's; "none" for none)
  --revision REV       the source revision, recorded as a label
  --daos-client DEB    daos-client_DAOSVERSION_ARCH.deb (deploy/daos/build-deb.sh): the image
                       variant with the DAOS client; its tag is VERSION-daos (the image's
                       `daos_agent`, `daos`, `dmg` and libdaos under /usr/lib/daos, where the
                       agent finds libdaos without DPUIO_DAOS_PREFIX)

The root filesystem holds what the package installs (but the systemd unit), the shared
libraries its binaries need (DT_NEEDED, resolved in the sysroot, transitively) and the one
the agent loads by soname (libfabric.so.1, for its ofi transports), UCX's transport modules
(loaded at run time from /usr/lib/<triplet>/ucx) and the chosen libibverbs providers with their dependencies, the copyright files of the Debian packages
those libraries come from, and a list of those packages with their versions
(/usr/share/dpuio/image-packages.txt). No shell, no package manager. With --daos-client it
also holds that package's files (but its systemd unit, C headers and daos.pc) and the libraries
they need, found the same way (each DAOS library's own $ORIGIN run path first, so DAOS's
libfabric and mercury come from its tree), and /var/run -> /run with /run/daos_agent, the
dRPC socket directory the static pod shares between daos_agent and the agent.

The output is reproducible: entries sorted, owner root, mtimes and `created` from
SOURCE_DATE_EPOCH (default 0). Only the Python standard library is used.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import struct
import sys
import tarfile
import tempfile

ARCHES = {
    # Debian name: (OCI architecture, multiarch triplet, ELF e_machine)
    "amd64": ("amd64", "x86_64-linux-gnu", 62),
    "arm64": ("arm64", "aarch64-linux-gnu", 183),
}
AGENT_PORT = 7300
# Libraries the agent loads with dlopen by soname.
DLOPENED = ("libfabric.so.1", "libucp.so.0")
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"


class BuildError(Exception):
    pass


# ---------------------------------------------------------------------------- ELF


class Elf:
    """The parts of a 64-bit little-endian ELF file the image needs: machine, PT_INTERP,
    DT_NEEDED, DT_RUNPATH/DT_RPATH."""

    def __init__(self, path, data):
        if data[:4] != b"\x7fELF":
            raise BuildError(f"{path}: not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise BuildError(f"{path}: not a 64-bit little-endian ELF file")
        (self.machine,) = struct.unpack_from("<H", data, 18)
        phoff, = struct.unpack_from("<Q", data, 32)
        phentsize, phnum = struct.unpack_from("<HH", data, 54)
        loads, dynamic = [], None
        self.interp = None
        for i in range(phnum):
            p_type, _flags, offset, vaddr, _paddr, filesz, _memsz, _align = struct.unpack_from(
                "<IIQQQQQQ", data, phoff + i * phentsize
            )
            if p_type == 1:  # PT_LOAD
                loads.append((vaddr, offset, filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (offset, filesz)
            elif p_type == 3:  # PT_INTERP
                self.interp = data[offset : offset + filesz].rstrip(b"\0").decode()
        self.needed = []
        if dynamic is None:
            return
        self.runpath = []
        needed_offsets, runpath_offsets, strtab = [], [], None
        off, size = dynamic
        for pos in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                needed_offsets.append(val)
            elif tag in (15, 29):  # DT_RPATH, DT_RUNPATH
                runpath_offsets.append(val)
            elif tag == 5:  # DT_STRTAB (an address)
                strtab = val
        if needed_offsets and strtab is None:
            raise BuildError(f"{path}: DT_NEEDED without DT_STRTAB")
        if strtab is not None:
            for vaddr, offset, filesz in loads:
                if vaddr <= strtab < vaddr + filesz:
                    strtab = strtab - vaddr + offset
                    break
            else:
                raise BuildError(f"{path}: DT_STRTAB is in no PT_LOAD segment")
        def string(n):
            return data[strtab + n : data.index(b"\0", strtab + n)].decode()

        self.needed = [string(n) for n in needed_offsets]
        self.runpath = [d for n in runpath_offsets for d in string(n).split(":") if d]


# ---------------------------------------------------------------------------- the root filesystem


class RootFs:
    """Entries by path (no leading slash): ("dir", mode) | ("file", mode, bytes) |
    ("symlink", target)."""

    def __init__(self):
        self.entries = {}

    def dir(self, path, mode=0o755):
        path = path.strip("/")
        if not path:
            return
        self.dir(os.path.dirname(path))
        kind = self.entries.get(path)
        if kind is not None and kind[0] != "dir":
            raise BuildError(f"/{path} is both a directory and a {kind[0]}")
        if kind is None or mode != 0o755:
            self.entries[path] = ("dir", mode)

    def file(self, path, data, mode=0o644):
        path = path.strip("/")
        self.dir(os.path.dirname(path))
        old = self.entries.get(path)
        if old is not None and old != ("file", mode, data):
            raise BuildError(f"/{path} would be written twice, differently (contents or mode)")
        self.entries[path] = ("file", mode, data)

    def symlink(self, path, target):
        path = path.strip("/")
        self.dir(os.path.dirname(path))
        old = self.entries.get(path)
        if old is not None and old != ("symlink", target):
            raise BuildError(f"/{path} is already a {old[0]}")
        self.entries[path] = ("symlink", target)

    def dedupe(self):
        """Files with the same contents and mode become relative symlinks to one of them
        (libibverbs/libmlx5-rdmav34.so is libmlx5.so.1, as in Debian)."""
        first = {}
        for path in sorted(self.entries, key=lambda p: (p.count("/"), p)):
            entry = self.entries[path]
            if entry[0] != "file":
                continue
            key = (entry[1], hashlib.sha256(entry[2]).digest())
            if key in first:
                self.entries[path] = ("symlink", os.path.relpath(first[key], os.path.dirname(path)))
            else:
                first[key] = path

    def write_tar(self, out, mtime):
        """An uncompressed tar of every entry, sorted, owned by root, with mtime `mtime`."""
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                entry = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mtime = mtime
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if entry[0] == "dir":
                    info.type, info.mode = tarfile.DIRTYPE, entry[1]
                    tar.addfile(info)
                elif entry[0] == "symlink":
                    info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, entry[1]
                    tar.addfile(info)
                else:
                    info.type, info.mode, info.size = tarfile.REGTYPE, entry[1], len(entry[2])
                    tar.addfile(info, io.BytesIO(entry[2]))


def usrmerged(path):
    """/lib/x -> usr/lib/x (the image is /usr-merged, as Debian is)."""
    path = path.strip("/")
    for top in ("bin", "sbin", "lib", "lib64"):
        if path == top or path.startswith(top + "/"):
            return "usr/" + path
    return path


def read_ar(path):
    """Members of an ar archive (a .deb) as {name: bytes}."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"!<arch>\n":
        raise BuildError(f"{path}: not a Debian package (no ar header)")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)
    return members


def deb_fields(tar):
    with tar:
        for m in tar.getmembers():
            if m.name in ("./control", "control"):
                text = tar.extractfile(m).read().decode()
                return dict(re.findall(r"^([A-Za-z-]+): *(.*)$", text, re.M))
    raise BuildError("the package has no control file")


def open_member_tar(name, blob):
    if name.endswith(".zst"):
        raise BuildError(f"{name} is zstd-compressed, which Python cannot read: build the package with -Zxz or -Zgzip")
    try:
        return tarfile.open(fileobj=io.BytesIO(blob))
    except tarfile.TarError as e:
        raise BuildError(f"{name}: {e}") from e


def read_deb(path, package, arch, version=None):
    """The control fields and the data tar of the Debian package `path`, checked to be
    `package` for `arch` (and `version`, when given)."""
    members = read_ar(path)
    control_name = next((n for n in members if n.startswith("control.tar")), None)
    data_name = next((n for n in members if n.startswith("data.tar")), None)
    if control_name is None or data_name is None:
        raise BuildError(f"{path}: not a Debian binary package (no control.tar or data.tar)")
    fields = deb_fields(open_member_tar(control_name, members[control_name]))
    if fields.get("Package") != package:
        raise BuildError(f"{path} is the package {fields.get('Package')!r}, not {package}")
    if fields.get("Architecture") != arch:
        raise BuildError(f"{path} is for {fields.get('Architecture')}, not {arch}")
    if version is not None and fields.get("Version") != version:
        raise BuildError(f"{path} is version {fields.get('Version')}, not {version}")
    return fields, open_member_tar(data_name, members[data_name])


def add_package_files(rootfs, deb, tar, skip=()):
    """Put the files of a package's data tar into the image, but its systemd units and the
    paths under `skip`; returns its ELF files {image path: bytes}."""
    elf_files = {}
    with tar:
        for m in tar.getmembers():
            path = usrmerged(os.path.normpath(m.name))
            if path in (".", "") or path.startswith("usr/lib/systemd"):
                continue  # no systemd in a container: the pod is the unit
            if any(path == d or path.startswith(d + "/") for d in skip):
                continue
            if m.isdir():
                rootfs.dir(path, m.mode)
            elif m.issym():
                rootfs.symlink(path, m.linkname)
            elif m.isfile():
                data = tar.extractfile(m).read()
                rootfs.file(path, data, m.mode)
                if data[:4] == b"\x7fELF":
                    elf_files["/" + path] = data
            else:
                raise BuildError(f"{deb}: {m.name} is neither a file, a directory nor a symlink")
    return elf_files


class Sysroot:
    """Finds ARCH's shared libraries and the Debian packages they belong to."""

    def __init__(self, root, triplet, machine):
        self.root, self.triplet, self.machine = root, triplet, machine
        self.dirs = [f"usr/lib/{triplet}", f"lib/{triplet}", "usr/lib", "lib"]
        self._owners = None

    def host_path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def resolve(self, path):
        """The real file behind `path` inside the sysroot (absolute symlinks stay inside)."""
        path = "/" + path.lstrip("/")
        for _ in range(40):
            parts = path.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                prefix = "/" + "/".join(parts[:i])
                host = self.host_path(prefix)
                if os.path.islink(host):
                    target = os.readlink(host)
                    base = "/" if target.startswith("/") else os.path.dirname(prefix)
                    path = os.path.normpath(os.path.join(base, target, *parts[i:]))
                    break
            else:
                return path
        raise BuildError(f"{path}: too many symbolic links")

    def library(self, soname):
        """(real path in the sysroot, bytes) of `soname` for this architecture."""
        for d in self.dirs:
            candidate = f"/{d}/{soname}"
            if not os.path.exists(self.host_path(candidate)):
                continue
            real = self.resolve(candidate)
            with open(self.host_path(real), "rb") as f:
                data = f.read()
            if Elf(real, data).machine == self.machine:
                return real, data
        raise BuildError(
            f"{soname} for {self.triplet} is not installed under {self.root} "
            f"(searched {', '.join('/' + d for d in self.dirs)}): apt-get install the package that has it"
        )

    def owner(self, path):
        """The Debian package (name, architecture, version) that installed `path`, or None."""
        if self._owners is None:
            self._owners, versions = {}, {}
            info = self.host_path("var/lib/dpkg/info")
            status = self.host_path("var/lib/dpkg/status")
            if os.path.exists(status):
                with open(status, encoding="utf-8", errors="replace") as f:
                    for block in f.read().split("\n\n"):
                        fields = dict(re.findall(r"^([A-Za-z-]+): *(.*)$", block, re.M))
                        if "Package" in fields:
                            versions[(fields["Package"], fields.get("Architecture", ""))] = fields.get("Version", "")
            if os.path.isdir(info):
                for name in sorted(os.listdir(info)):
                    if not name.endswith(".list"):
                        continue
                    pkg, _, arch = name[:-5].partition(":")
                    arch = arch or next((a for (p, a) in versions if p == pkg), "")
                    version = versions.get((pkg, arch), "")
                    with open(os.path.join(info, name), encoding="utf-8", errors="replace") as f:
                        for line in f:
                            self._owners.setdefault(line.rstrip("\n"), (pkg, arch, version))
        for candidate in (path, "/" + usrmerged(path), path.replace("/usr/lib/", "/lib/", 1)):
            if candidate in self._owners:
                return self._owners[candidate]
        return None


def add_libraries(rootfs, sysroot, elf_files, triplet, plugin_dirs=()):
    """Add the DT_NEEDED closure of `elf_files` ({image path: bytes}) to the image under
    usr/lib/TRIPLET; returns the sysroot paths the libraries came from. An object in one of
    `plugin_dirs` is a plugin that a library of the directory above loads (mercury's NA
    plugins need libna.so.6, which is what dlopens them): a soname the image holds there is
    already loaded when the plugin is, wherever the plugin's run path points."""
    libdir = f"usr/lib/{triplet}"
    pending = list(elf_files.items())
    done, sources = set(), []
    while pending:
        path, data = pending.pop()
        elf = Elf(path, data)
        if elf.machine != sysroot.machine:
            raise BuildError(f"{path} is for ELF machine {elf.machine}, not {triplet}: wrong package architecture?")
        if elf.interp and elf.interp not in done:
            done.add(elf.interp)
            real, lib = sysroot.library(os.path.basename(elf.interp))
            sources.append(real)
            rootfs.file(f"{libdir}/{os.path.basename(elf.interp)}", lib, 0o755)
            link = usrmerged(elf.interp)
            if link != f"{libdir}/{os.path.basename(elf.interp)}":
                rootfs.symlink(link, os.path.relpath(f"{libdir}/{os.path.basename(elf.interp)}", os.path.dirname(link)))
        # A library in a RUNPATH directory of the object (UCX's modules name their own) that
        # the image already holds is taken from there.
        origin = os.path.dirname(path.lstrip("/"))
        local = [os.path.normpath(d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)).lstrip("/") for d in elf.runpath]
        if origin in plugin_dirs:
            local.append(os.path.dirname(origin))
        for soname in elf.needed:
            if soname in done or any(f"{d}/{soname}" in rootfs.entries for d in local):
                continue
            done.add(soname)
            try:
                real, lib = sysroot.library(soname)
            except BuildError as e:
                raise BuildError(f"{e} (needed by {path})") from None
            sources.append(real)
            # The dynamic loader is also a DT_NEEDED of libc: executable either way.
            mode = 0o755 if elf.interp and soname == os.path.basename(elf.interp) or soname.startswith("ld-") else 0o644
            rootfs.file(f"{libdir}/{soname}", lib, mode)
            pending.append((f"/{libdir}/{soname}", lib))
    return sources


def plugins(sysroot, triplet, providers):
    """UCX's transport modules and the libibverbs providers: {image path: bytes}, and the
    sysroot paths and extra files (driver files) they came with."""
    found, extra = {}, {}
    ucx = f"/usr/lib/{triplet}/ucx"
    if os.path.isdir(sysroot.host_path(ucx)):
        for name in sorted(os.listdir(sysroot.host_path(ucx))):
            # libuct_ib.so.0: the name UCX dlopens (the .so and .a are libucx-dev's).
            if re.fullmatch(r"lib\w+\.so\.\d+", name):
                real = sysroot.resolve(f"{ucx}/{name}")
                with open(sysroot.host_path(real), "rb") as f:
                    found[f"usr/lib/{triplet}/ucx/{name}"] = (real, f.read())
    for p in providers:
        pdir = f"/usr/lib/{triplet}/libibverbs"
        names = [
            n for n in sorted(os.listdir(sysroot.host_path(pdir))) if re.fullmatch(rf"lib{re.escape(p)}-rdmav\d+\.so", n)
        ] if os.path.isdir(sysroot.host_path(pdir)) else []
        if not names:
            raise BuildError(f"libibverbs provider {p!r} for {triplet} is not installed under {sysroot.root} (ibverbs-providers)")
        for n in names:
            real = sysroot.resolve(f"{pdir}/{n}")
            with open(sysroot.host_path(real), "rb") as f:
                found[f"usr/lib/{triplet}/libibverbs/{n}"] = (real, f.read())
        driver = f"/etc/libibverbs.d/{p}.driver"
        if os.path.exists(sysroot.host_path(driver)):
            with open(sysroot.host_path(driver), "rb") as f:
                extra[driver.lstrip("/")] = f.read()
    return found, extra


# ---------------------------------------------------------------------------- OCI


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(args):
    if args.arch not in ARCHES:
        raise BuildError(f"unknown architecture {args.arch!r}: amd64 or arm64")
    oci_arch, triplet, machine = ARCHES[args.arch]
    if not os.path.isfile(args.deb):
        raise BuildError(f"{args.deb}: no such package (deploy/debian/build-debs.sh makes it)")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+~-]*", args.version):
        raise BuildError(f"{args.version!r} is not a version")
    if not re.fullmatch(r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*", args.name):
        raise BuildError(f"{args.name!r} is not an image name (lower case, e.g. localhost/dpuio/dpu-agent)")
    if not os.path.isdir(args.sysroot):
        raise BuildError(f"--sysroot {args.sysroot}: no such directory")
    try:
        epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    except ValueError:
        raise BuildError(f"SOURCE_DATE_EPOCH={os.environ['SOURCE_DATE_EPOCH']!r} is not a number of seconds") from None
    sysroot = Sysroot(args.sysroot, triplet, machine)

    _fields, data = read_deb(args.deb, "dpuio-agent", args.arch, args.version)
    rootfs = RootFs()
    elf_files = add_package_files(rootfs, args.deb, data)
    for binary in ("usr/bin/dpu-agent", "usr/bin/dpuctl"):
        if "/" + binary not in elf_files:
            raise BuildError(f"{args.deb} has no /{binary}")
    tag, daos = args.version, None
    if args.daos_client:
        if not os.path.isfile(args.daos_client):
            raise BuildError(f"--daos-client {args.daos_client}: no such package (deploy/daos/build-deb.sh makes it)")
        fields, data = read_deb(args.daos_client, "daos-client", args.arch)
        daos = (fields["Package"], args.arch, fields.get("Version", ""))
        # The headers and daos.pc are for building against libdaos: no compiler in the image.
        skip = ("usr/lib/daos/include", f"usr/lib/{triplet}/pkgconfig")
        daos_elf = add_package_files(rootfs, args.daos_client, data, skip=skip)
        for binary in ("usr/bin/daos_agent", "usr/bin/daos", "usr/lib/daos/lib64/libdfs.so"):
            if binary not in rootfs.entries:
                raise BuildError(f"{args.daos_client} has no /{binary}")
        elf_files.update(daos_elf)
        tag = f"{args.version}-daos"

    providers = [] if args.ibverbs_providers in ("", "none") else args.ibverbs_providers.split(",")
    found, extra = plugins(sysroot, triplet, providers)
    # The agent's ofi transports dlopen libfabric.so.1 (no DT_NEEDED names it): the sysroot's,
    # which the loader finds when no DAOS client has mapped its own first. Its UCX
    # transports dlopen libucp.so.0 the same way; the closure below brings libucs/uct/ucm.
    for soname in DLOPENED:
        real, lib = sysroot.library(soname)
        found[f"usr/lib/{triplet}/{soname}"] = (real, lib)
    sources = [real for real, _ in found.values()]
    for path, (_real, data) in found.items():
        rootfs.file(path, data, 0o644)
        elf_files["/" + path] = data
    for path, data in extra.items():
        rootfs.file(path, data, 0o644)
    # Mercury loads its NA plugins (libna_plugin_ofi.so...) from the directory `mercury`
    # beside libna.
    plugin_dirs = [d for d in ("usr/lib/daos/prereq/release/mercury/lib64/mercury",) if d in rootfs.entries]
    sources += add_libraries(rootfs, sysroot, elf_files, triplet, plugin_dirs)

    # The Debian packages the libraries come from: their copyright files and a list.
    packages = {}
    for src in sources:
        owner = sysroot.owner(src)
        if owner is None:
            raise BuildError(f"{src} belongs to no installed Debian package under {args.sysroot}")
        packages[owner[0]] = owner
    listing = []
    for pkg in sorted(packages):
        name, arch, version = packages[pkg]
        listing.append(f"{name}:{arch} {version}")
        copyright_path = f"/usr/share/doc/{name}/copyright"
        real = sysroot.resolve(copyright_path)
        if os.path.isfile(sysroot.host_path(real)):
            with open(sysroot.host_path(real), "rb") as f:
                rootfs.file(copyright_path, f.read())
    # The daos-client package (its copyright file is among its own files).
    if daos is not None:
        listing = sorted(listing + [f"{daos[0]}:{daos[1]} {daos[2]}"])
    rootfs.file("usr/share/dpuio/image-packages.txt", ("\n".join(listing) + "\n").encode())
    rootfs.dedupe()

    # What a container runtime expects, and what the agent uses.
    for d in ("proc", "sys", "dev", "etc", "root", "run/dpuio", "var/lib/dpuio"):
        rootfs.dir(d, 0o700 if d == "root" else 0o755)
    rootfs.dir("tmp", 0o1777)
    for top in ("bin", "sbin", "lib"):
        rootfs.symlink(top, f"usr/{top}")
        rootfs.dir(f"usr/{top}")
    if args.arch == "amd64":
        rootfs.symlink("lib64", "usr/lib64")
    if daos is not None:
        # daos_agent's default runtime_dir and the agent's default agent_socket_dir are
        # /var/run/daos_agent: the pod mounts its shared socket directory there.
        rootfs.dir("var")
        rootfs.symlink("var/run", "../run")
        rootfs.dir("run/daos_agent")
    rootfs.file("etc/passwd", b"root:x:0:0:root:/root:/usr/sbin/nologin\n")
    rootfs.file("etc/group", b"root:x:0:\n")
    rootfs.file("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n")
    rootfs.file(
        "etc/os-release",
        f'NAME="dpuio agent image"\nID=dpuio\nVERSION_ID="{args.version}"\n'
        f'PRETTY_NAME="dpu-agent {tag} ({args.arch})"\n'.encode(),
    )

    with tempfile.TemporaryDirectory() as tmp:
        layer_tar = os.path.join(tmp, "layer.tar")
        with open(layer_tar, "wb") as f:
            rootfs.write_tar(f, epoch)
        with open(layer_tar, "rb") as f:
            raw = f.read()
        diff_id = sha256(raw)
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
            gz.write(raw)
        layer = buf.getvalue()
    del raw

    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {
        "org.opencontainers.image.title": "dpu-agent",
        "org.opencontainers.image.description": "dpuio agent for BlueField DPUs: gRPC control plane over mutual TLS, UCX data plane",
        "org.opencontainers.image.version": args.version,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.created": created,
        "io.dpuio.package": f"dpuio-agent_{args.version}_{args.arch}.deb",
        "io.dpuio.runtime-packages": ", ".join(listing),
    }
    if daos is not None:
        labels["org.opencontainers.image.description"] += "; with the DAOS client (daos_agent, libdaos, libdfs)"
        labels["io.dpuio.daos-client"] = f"{daos[0]}_{daos[2]}_{daos[1]}.deb"
    if args.revision:
        labels["org.opencontainers.image.revision"] = args.revision
    config = {
        "created": created,
        "architecture": oci_arch,
        "os": "linux",
        "config": {
            "Entrypoint": ["/usr/bin/dpu-agent"],
            "Cmd": ["serve", "--config", "/etc/dpuio/agent.toml"],
            "Env": [
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                # As the systemd unit: the development client bundle (when no [tls] files).
                "DPUIO_CONFIG_DIR=/var/lib/dpuio/client",
            ],
            "ExposedPorts": {f"{AGENT_PORT}/tcp": {}},
            "Volumes": {"/var/lib/dpuio": {}},
            "WorkingDir": "/",
            "StopSignal": "SIGTERM",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [
            {
                "created": created,
                "created_by": f"deploy/image/build-oci.py: dpuio-agent {args.version} ({args.arch}) "
                + (f"with {daos[0]} {daos[2]} " if daos is not None else "")
                + f"and the runtime libraries of {len(packages)} Debian packages",
            }
        ],
    }
    if args.arch == "arm64":
        config["variant"] = "v8"
    config_blob = canonical(config)
    annotations = {
        "org.opencontainers.image.version": args.version,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.title": "dpu-agent",
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": sha256(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": sha256(layer), "size": len(layer)}],
        "annotations": annotations,
    }
    manifest_blob = canonical(manifest)
    platform = {"architecture": oci_arch, "os": "linux"}
    if args.arch == "arm64":
        platform["variant"] = "v8"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": sha256(manifest_blob),
                "size": len(manifest_blob),
                "platform": platform,
                "annotations": {
                    # The tag (`skopeo ... oci-archive:FILE:VERSION`, `ctr import --base-name NAME`)
                    "org.opencontainers.image.ref.name": tag,
                    # The full name containerd gives the image on import.
                    "io.containerd.image.name": f"{args.name}:{tag}",
                },
            }
        ],
    }
    layout = {
        "oci-layout": canonical({"imageLayoutVersion": "1.0.0"}),
        "index.json": canonical(index),
    }
    for blob in (config_blob, manifest_blob, layer):
        layout["blobs/sha256/" + sha256(blob)[7:]] = blob

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp_out = args.out + ".tmp"
    with open(tmp_out, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime, info.uname, info.gname = tarfile.DIRTYPE, 0o755, epoch, "root", "root"
            tar.addfile(info)
        for name in sorted(layout):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uname, info.gname = len(layout[name]), 0o644, epoch, "root", "root"
            tar.addfile(info, io.BytesIO(layout[name]))
    os.replace(tmp_out, args.out)
    return {
        "out": args.out,
        "image": f"{args.name}:{tag}",
        "manifest": sha256(manifest_blob),
        "layer_bytes": len(layer),
        "files": sum(1 for e in rootfs.entries.values() if e[0] == "file"),
        "packages": listing,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True)
    parser.add_argument("--deb", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sysroot", default="/")
    parser.add_argument("--name", default="localhost/dpuio/dpu-agent")
    parser.add_argument("--ibverbs-providers", default="mlx5")
    parser.add_argument("--revision", default="")
    parser.add_argument("--daos-client", default="")
    args = parser.parse_args()
    try:
        result = build(args)
    except (BuildError, OSError) as e:
        print(f"build-oci: {e}", file=sys.stderr)
        return 1
    print(
        f"{result['out']}: {result['image']} {result['manifest']} "
        f"({result['files']} files, layer {result['layer_bytes'] / 1e6:.1f} MB, "
        f"{len(result['packages'])} Debian packages' libraries)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
