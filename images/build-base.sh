#!/usr/bin/env bash
# Build a minimal Debian root filesystem as a tarball, for `docker import` as the base image of
# the plugin and workload images when no container registry is reachable (Debian's mirror is).
#
#   images/build-base.sh OUT.tar SUITE MIRROR PACKAGES [DEB_CACHE]
#
# PACKAGES is comma-separated (e.g. python3), added to debootstrap's minbase. DEB_CACHE keeps the
# downloaded .debs between builds. Needs root (debootstrap chroots and makes device nodes).
# The tarball is written atomically: OUT.tar exists only when the build succeeded.
set -euo pipefail

if [[ $# -lt 4 ]]; then
  echo "usage: $0 OUT.tar SUITE MIRROR PACKAGES [DEB_CACHE]" >&2
  exit 2
fi
out=$1 suite=$2 mirror=$3 packages=$4 debs=${5:-}
command -v debootstrap >/dev/null || { echo "build-base: debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }

root=$(mktemp -d "$(dirname "$out")/.rootfs.XXXXXX")

mounts_under() {
  # Mount points below the build root (debootstrap mounts proc and sys while it installs).
  awk -v r="$root/" 'index($5, r) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

cleanup() {
  local mp
  for mp in $(mounts_under); do umount -l "$mp" || true; done
  if [[ -n "$(mounts_under)" ]]; then
    # Never rm -rf through a mount: that would delete the host's files.
    echo "build-base: mounts left under $root, not removing it" >&2
    return
  fi
  rm -rf "$root" "$out.tmp"
}
trap cleanup EXIT

args=(--variant=minbase --include="$packages")
if [[ -n "$debs" ]]; then
  mkdir -p "$debs"
  args+=(--cache-dir="$debs")
fi
debootstrap "${args[@]}" "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -20 "$root.log" >&2
  rm -f "$root.log"
  exit 1
}
rm -f "$root.log"

# What an image never needs: package caches and lists, docs, manuals, translations, logs.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/var/log/* "$root"/var/cache/debconf/*-old \
  "$root"/var/lib/dpkg/*-old
# docker import fills in /dev, /proc and /sys at run time; debootstrap's device nodes are not
# wanted in an image layer.
find "$root/dev" -mindepth 1 -delete

if [[ -n "$(mounts_under)" ]]; then
  echo "build-base: debootstrap left mounts under $root" >&2
  exit 1
fi
# mtimes are kept: the .pyc files of the stdlib are checked against them.
tar --numeric-owner --sort=name -C "$root" -cf "$out.tmp" .
mv "$out.tmp" "$out"
