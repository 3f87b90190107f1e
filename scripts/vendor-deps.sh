#!/usr/bin/env bash
# Unpacks the headers the Python package's standalone build needs beyond
# PyTorch, CMake and pybind11 (fmt, spdlog, nlohmann-json, zlib) from their
# Debian packages into DIR/include (default DIR .deps/, ignored by git), and
# copies Fashion-MNIST for the CNN example into DIR/fashion-mnist, so that the
# working tree carries them to a machine without Debian's packages, e.g. a
# GPU image with its own PyTorch and no network (scripts/gpu-check.sh; the
# device tool's `carry` takes .deps). python/CMakeLists.txt uses them when
# the machine's own packages are missing: fmt and spdlog compiled in (their
# header-only modes), zlib's header against the machine's libz.so.1.
#
#   scripts/vendor-deps.sh [DIR]
#
# Run it on a Debian 12 machine (scripts/setup.sh installs the packages, and
# apt keeps their .deb files); a package whose .deb is not in apt's cache is
# fetched with `apt-get download`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.deps}"
PACKAGES=(libfmt-dev libspdlog-dev nlohmann-json3-dev zlib1g-dev)
command -v dpkg-deb > /dev/null || { echo "vendor-deps: needs dpkg-deb (a Debian machine)" >&2; exit 2; }

work="$(mktemp -d)"
chmod 755 "$work"  # apt-get download writes as its own user
trap 'rm -rf "$work"' EXIT
rm -rf "$DIR.new"
mkdir -p "$DIR.new"
for package in "${PACKAGES[@]}"; do
  version="$(dpkg-query -W -f='${Version}' "$package" 2> /dev/null || true)"
  deb=""
  if [[ -n $version ]]; then
    # apt names the file package_version_arch.deb with the epoch's ':' as %3a.
    deb="$(ls /var/cache/apt/archives/"${package}_${version/:/%3a}"_*.deb 2> /dev/null | head -n 1 || true)"
  fi
  if [[ -z $deb ]]; then
    (cd "$work" && apt-get download -qq "$package") ||
      { echo "vendor-deps: no .deb of $package in apt's cache and apt-get download failed" >&2; exit 1; }
    deb="$(ls "$work/${package}"_*.deb | head -n 1)"
  fi
  dpkg-deb -x "$deb" "$work/unpacked"
  echo "vendor-deps: $(basename "$deb")"
done
# Only the headers: the libraries are compiled in or the machine's own.
mv "$work/unpacked/usr/include" "$DIR.new/include"
for header in fmt/format.h spdlog/spdlog.h nlohmann/json.hpp zlib.h; do
  [[ -f $DIR.new/include/$header ]] ||
    { echo "vendor-deps: the packages left no usr/include/$header" >&2; exit 1; }
done
# Fashion-MNIST (Debian's dataset-fashion-mnist) for gpu-check.sh's CNN example.
DATASET=/usr/share/datasets/fashion-mnist
if compgen -G "$DATASET/*.gz" > /dev/null; then
  mkdir -p "$DIR.new/fashion-mnist"
  cp "$DATASET"/*.gz "$DIR.new/fashion-mnist/"
else
  echo "vendor-deps: no $DATASET (dataset-fashion-mnist): gpu-check.sh's example will lack it" >&2
fi
rm -rf "$DIR"
mv "$DIR.new" "$DIR"
echo "vendor-deps: $DIR ($(du -sh "$DIR" | cut -f1)): $(ls "$DIR" | tr '\n' ' ')"
