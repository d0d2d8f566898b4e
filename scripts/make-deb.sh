#!/usr/bin/env bash
# make-deb.sh - build the Debian package kiln_VERSION_ARCH.deb from an
# existing CMake build tree (`make deb` calls it; no second compile).
#
# It installs the build into a staging tree with prefix /usr (`cmake
# --install --strip`, so exactly what `make install` installs: the kiln tool,
# libkiln.so.VERSION with its SONAME link, the header, kiln.pc and the CMake
# package), adds the docs under /usr/share/doc/kiln, computes Depends with
# dpkg-shlibdeps from the ELF files' NEEDED entries (so libdnnl,
# libprotobuf-c, libmicrohttpd, libnghttp2, libsodium, libgnutls ... come
# from the libraries this build really links) and packs it with dpkg-deb.
# One package holds runtime and development files; the tool finds libkiln in
# /usr/lib through its rpath $ORIGIN/../lib. tests/release/test_deb.sh checks
# the result.
# usage: make-deb.sh BUILD_DIR [OUT_DIR]   (prints the .deb's path)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
out=$(mkdir -p "${2:-$build}" && cd "${2:-$build}" && pwd)
version=$(sed -n 's/^#define KILN_VERSION_STRING "\(.*\)"/\1/p' "$src/include/kiln/kiln.h")
[ -n "$version" ] || { echo "make-deb: no KILN_VERSION_STRING in include/kiln/kiln.h" >&2; exit 1; }
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# dpkg-shlibdeps wants a source package layout: debian/control and debian/<pkg>/
root="$work/debian/kiln"
mkdir -p "$root/DEBIAN"
DESTDIR="$root" cmake --install "$build" --prefix /usr --strip > "$work/install.log" ||
  { cat "$work/install.log" >&2; exit 1; }
doc="$root/usr/share/doc/kiln"
mkdir -p "$doc"
cp "$src/README.md" "$doc/"
gzip -9nc "$src/CHANGELOG.md" > "$doc/changelog.gz"
cp -r "$src/docs" "$doc/docs"
rm -rf "$doc/docs/img"

cat > "$work/debian/control" <<EOF
Source: kiln
Maintainer: Kiln developers <kiln@localhost>

Package: kiln
Architecture: any
Description: model runtime and TensorFlow-Serving-compatible model server
EOF
elves=()
while IFS= read -r -d '' f; do
  if [ "$(head -c4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then elves+=("$f"); fi
done < <(find "$root/usr" -type f -print0)
[ ${#elves[@]} -gt 0 ] || { echo "make-deb: no ELF files installed" >&2; exit 1; }
libdir=$(dirname "$(find "$root/usr" -name 'libkiln.so.*' -type f | head -1)")
# libkiln itself is in this package: search it in the staging tree, need no shlibs for it
(cd "$work" && dpkg-shlibdeps -l"$libdir" --ignore-missing-info -O "${elves[@]}") \
  > "$work/substvars" 2> "$work/shlibdeps.log" || { cat "$work/shlibdeps.log" >&2; exit 1; }
depends=$(sed -n 's/^shlibs:Depends=//p' "$work/substvars")
[ -n "$depends" ] || { echo "make-deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: kiln
Version: $version
Architecture: $arch
Maintainer: Kiln developers <kiln@localhost>
Installed-Size: $size
Depends: $depends
Section: science
Priority: optional
Description: model runtime and TensorFlow-Serving-compatible model server
 Kiln loads ONNX models and TensorFlow SavedModels into one IR, optimizes
 them and runs them on the CPU with oneDNN and its own kernels. The kiln
 tool converts, inspects, benchmarks, signs and encrypts models, and
 kiln serve serves them over TensorFlow Serving's REST and gRPC APIs and
 KServe v2. Includes libkiln, its C header, kiln.pc and a CMake package.
EOF
# the shared library needs ldconfig run after install and removal
case "$libdir" in
  */usr/lib|*/usr/lib/*) echo "activate-noawait ldconfig" > "$root/DEBIAN/triggers" ;;
esac
find "$root" -type d -exec chmod 755 {} +
deb="$out/kiln_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" > /dev/null
echo "$deb"
