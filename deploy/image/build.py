#!/usr/bin/env python3
"""Builds the OCI image of `weir` without a container runtime, and checks it.

The image is an OCI image layout (https://github.com/opencontainers/image-spec,
`oci-layout`, `index.json`, `blobs/sha256/…`) with one layer, written by this
script: the `weir` binary at /usr/local/bin/weir (its debug information stripped:
the release profile keeps line tables, four fifths of the file; symbols stay, so
backtraces still name functions), the shared libraries it links
(as `ldd` resolves them, with the dynamic loader), the system's CA certificates,
/etc/passwd and /etc/group with the user `weir` (uid and gid 65532, the
Deployment's `runAsUser`), and /tmp. The layer is reproducible: entries sorted,
owned by root, mtime 0, gzip without a timestamp. Load it with
`skopeo copy oci:DIR:weir:VERSION docker-daemon:weir:VERSION`, `podman load`, or
push it with `crane push DIR REGISTRY/weir:VERSION`; `deploy/image/Containerfile`
builds the same with a builder.

--verify unpacks the layer into a fresh directory and runs `weir --version` and
`weir run --help` inside it with chroot (as root; otherwise in a user namespace
with `unshare -r`), so the image is known to run with nothing but its own files.

Usage:
  python3 deploy/image/build.py [--binary PATH] [--out DIR] [--tag TAG] [--verify]
Without --binary it runs `cargo build --release -p weir-cli` and takes
target/release/weir (CARGO_TARGET_DIR is honoured). Prints the layout's path and
the image's size.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

UID = GID = 65532
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def log(message):
    print(f"image: {message}", file=sys.stderr, flush=True)


def shared_libraries(binary):
    """The absolute paths `ldd` resolves for `binary`, the dynamic loader included."""
    out = subprocess.run(["ldd", str(binary)], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        line = line.strip()
        if "not found" in line:
            sys.exit(f"image: {binary} needs a library ldd cannot find: {line}")
        match = re.search(r"=>\s*(/\S+)", line) or re.match(r"(/\S+)", line)
        if match:
            libs.append(Path(match.group(1)))
    return libs


def stripped(binary):
    """`binary` without its debug information (`strip --strip-debug`), as bytes."""
    strip = shutil.which("strip")
    if strip is None:
        sys.exit("image: `strip` is missing (Debian package binutils)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "weir"
        subprocess.run([strip, "--strip-debug", "-o", str(out), str(binary)], check=True)
        return out.read_bytes()


def add_file(tar, source, target, mode):
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    info = tarfile.TarInfo(target.lstrip("/"))
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def add_bytes(tar, target, data, mode=0o644):
    info = tarfile.TarInfo(target.lstrip("/"))
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar, target, mode=0o755):
    info = tarfile.TarInfo(target.lstrip("/"))
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def layer(binary):
    """The layer as an uncompressed tar (bytes)."""
    files = {"/usr/local/bin/weir": (stripped(binary), 0o755)}
    for lib in shared_libraries(binary):
        files[str(lib)] = (lib.resolve(), 0o755)
    if not CA_BUNDLE.exists():
        sys.exit(f"image: {CA_BUNDLE} is missing (Debian package ca-certificates)")
    files[str(CA_BUNDLE)] = (CA_BUNDLE, 0o644)
    texts = {
        "/etc/passwd": f"root:x:0:0:root:/root:/sbin/nologin\nweir:x:{UID}:{GID}:weir:/tmp:/sbin/nologin\n",
        "/etc/group": f"root:x:0:\nweir:x:{GID}:\n",
        "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    }
    dirs = {"/tmp": 0o1777}
    for path in list(files) + list(texts):
        parent = Path(path).parent
        while str(parent) != "/":
            dirs.setdefault(str(parent), 0o755)
            parent = parent.parent
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(set(dirs) | set(files) | set(texts)):
            if path in dirs:
                add_dir(tar, path, dirs[path])
            elif path in files:
                source, mode = files[path]
                add_file(tar, source, path, mode)
            else:
                add_bytes(tar, path, texts[path].encode())
    return buffer.getvalue()


def write_blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    path = out / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def build(binary, out, tag, version):
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tar = layer(binary)
    # Level 6 (gzip's own default): a third of level 9's CPU for ~1 % more bytes.
    compressed = gzip.compress(tar, compresslevel=6, mtime=0)
    layer_desc = write_blob(out, compressed)
    layer_desc["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{UID}:{GID}",
            "Entrypoint": ["/usr/local/bin/weir"],
            "Cmd": ["--help"],
            "Env": [
                "PATH=/usr/local/bin",
                f"SSL_CERT_FILE={CA_BUNDLE}",
                "HOME=/tmp",
            ],
            "WorkingDir": "/tmp",
            "Labels": {
                "org.opencontainers.image.title": "weir",
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.source": "https://github.com/weir/weir",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]},
        "history": [{"created_by": "deploy/image/build.py"}],
    }
    config_desc = write_blob(out, json.dumps(config, sort_keys=True).encode())
    config_desc["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = write_blob(out, json.dumps(manifest, sort_keys=True).encode())
    manifest_desc["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (out / "index.json").write_text(json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
         "manifests": [manifest_desc]}, sort_keys=True))
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return len(tar), len(compressed)


def verify(out):
    """Unpacks the image's layers (following index → manifest → layers) and runs weir in them."""
    index = json.loads((out / "index.json").read_text())
    blob = lambda desc: out / "blobs" / "sha256" / desc["digest"].split(":", 1)[1]
    manifest = json.loads(blob(index["manifests"][0]).read_text())
    config = json.loads(blob(manifest["config"]).read_text())
    assert config["config"]["User"] == f"{UID}:{GID}", config["config"]["User"]
    root = Path(tempfile.mkdtemp(prefix="weir-image-"))
    # The image's `/`: mkdtemp's 0700 would keep the image's user out of its own root.
    root.chmod(0o755)
    try:
        for desc in manifest["layers"]:
            data = blob(desc).read_bytes()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == desc["digest"], "layer digest"
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
                tar.extractall(root, filter="tar")
        entry = config["config"]["Entrypoint"]
        env = dict(item.split("=", 1) for item in config["config"]["Env"])
        # Found on this machine's PATH; the command inside runs with the image's environment.
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        if os.geteuid() == 0:
            prefix = [chroot, f"--userspec={UID}:{GID}", str(root)]
        else:
            unshare = shutil.which("unshare") or "/usr/bin/unshare"
            prefix = [unshare, "--user", "--map-root-user", chroot, str(root)]
        for args in (["--version"], ["run", "--help"]):
            result = subprocess.run(prefix + entry + args, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                sys.exit(f"image: `weir {' '.join(args)}` failed in the image "
                         f"(exit {result.returncode}):\n{result.stdout}{result.stderr}")
            first = (result.stdout.strip().splitlines() or [""])[0]
            log(f"`weir {' '.join(args)}` in the image: {first}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", type=Path, help="the weir binary (default: a release build)")
    ap.add_argument("--out", type=Path, default=None, help="the OCI layout directory")
    ap.add_argument("--tag", default=None, help="the image's tag (default: the crate version)")
    ap.add_argument("--verify", action="store_true", help="run weir inside the unpacked image")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parents[2]
    target = Path(os.environ.get("CARGO_TARGET_DIR", repo / "target"))
    binary = args.binary
    if binary is None:
        log("cargo build --release -p weir-cli")
        subprocess.run(["cargo", "build", "--release", "-p", "weir-cli"], check=True, cwd=repo)
        binary = target / "release" / "weir"
    version = subprocess.run([str(binary), "--version"], check=True, capture_output=True,
                             text=True).stdout.split()[-1]
    tag = args.tag or version
    out = args.out or target / "image" / "weir-oci"
    raw, packed = build(binary, out, tag, version)
    log(f"OCI layout {out} (tag {tag}): layer {raw / 1e6:.1f} MB, {packed / 1e6:.1f} MB gzipped")
    if args.verify:
        verify(out)
    print(out)


if __name__ == "__main__":
    main()
