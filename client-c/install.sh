#!/bin/sh
# Installs libpfs (crate pfs-client-c) under a prefix, after
#   cargo build --release -p pfs-client-c
#
#   client-c/install.sh [PREFIX]          # default /usr/local
#
# PREFIX/include/pfs.h                    the header
# PREFIX/lib/libpfs.so.VERSION            the shared library (SONAME libpfs.so.0)
# PREFIX/lib/libpfs.so.0 -> libpfs.so.VERSION   the name programs load
# PREFIX/lib/libpfs.so -> libpfs.so.0     the name the linker finds (-lpfs)
# PREFIX/lib/libpfs.a                     the static library
# PREFIX/lib/pkgconfig/pfs.pc             pfs.pc.in with PREFIX and VERSION
#
# VERSION is the crate's version, from the manifests. Environment:
#   PFS_BUILD_DIR  where libpfs.so and libpfs.a are
#                  (default: ${CARGO_TARGET_DIR:-target}/release)
#   DESTDIR        staging root, as for `make install` (default: none)
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
prefix=${1:-/usr/local}
build=${PFS_BUILD_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}
dest=${DESTDIR:-}

# The crate's version, read from the manifests (no cargo needed to install
# prebuilt libraries): client-c/Cargo.toml's own `version = "..."`, else
# the workspace's `[workspace.package]` one that it inherits.
version=$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$here/Cargo.toml")
[ -n "$version" ] ||
    version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml")
abi=$(sed -n 's/^#define PFS_ABI_VERSION \([0-9]*\)$/\1/p' "$here/include/pfs.h")
[ -n "$version" ] && [ -n "$abi" ] || {
    echo "install.sh: cannot read the version from $here/Cargo.toml or $root/Cargo.toml, or PFS_ABI_VERSION from pfs.h" >&2
    exit 1
}
for f in libpfs.so libpfs.a; do
    [ -f "$build/$f" ] || {
        echo "install.sh: no $build/$f: run cargo build --release -p pfs-client-c (or set PFS_BUILD_DIR)" >&2
        exit 1
    }
done

lib=$dest$prefix/lib
install -d "$dest$prefix/include" "$lib/pkgconfig"
install -m 0644 "$here/include/pfs.h" "$dest$prefix/include/pfs.h"
install -m 0755 "$build/libpfs.so" "$lib/libpfs.so.$version"
ln -sf "libpfs.so.$version" "$lib/libpfs.so.$abi"
ln -sf "libpfs.so.$abi" "$lib/libpfs.so"
install -m 0644 "$build/libpfs.a" "$lib/libpfs.a"
# The prefix as a sed replacement: `&`, `|` and `\` taken literally.
esc=$(printf '%s\n' "$prefix" | sed 's/[&|\\]/\\&/g')
sed -e "s|^prefix=@PREFIX@\$|prefix=$esc|" -e "s|^Version: @VERSION@\$|Version: $version|" \
    "$here/pfs.pc.in" >"$lib/pkgconfig/pfs.pc"
chmod 0644 "$lib/pkgconfig/pfs.pc"
echo "installed libpfs $version (libpfs.so.$abi) under $dest$prefix"
