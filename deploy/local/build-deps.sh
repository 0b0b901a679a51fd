#!/usr/bin/env bash
# Installs from Debian's packages, once: the C libraries the `weir` binary links (with headers,
# found through pkg-config) — OpenSSL (librdkafka's TLS and SASL/SCRAM) and zstd (librdkafka's
# zstd codec) —, the openssl command (deploy/local/kafka.sh makes its test CA with it), the CA
# certificates the image ships, binutils (deploy/image/build.py strips the binary it ships) and
# curl (the README's quick start). Linking Debian's OpenSSL and zstd rather than compiling them
# keeps them out of the cold build (and patched by the distribution); deploy/image/build.py ships
# the shared libraries beside the binary.
#
# Usage: bash deploy/local/build-deps.sh
set -euo pipefail

packages=(libssl-dev libzstd-dev pkg-config openssl ca-certificates curl binutils)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  printf 'build-deps.sh: installing %s from Debian (one-off) ...\n' "${missing[*]}" >&2
  sudo_cmd=()
  [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
  # The package lists may be stale on a fresh machine: refresh them once if the install fails.
  if ! DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2; then
    "${sudo_cmd[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >&2
  fi
fi
