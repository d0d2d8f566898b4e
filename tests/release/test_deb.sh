#!/usr/bin/env bash
# test_deb.sh - the Debian package end to end: build kiln_VERSION_ARCH.deb
# from this build tree with scripts/make-deb.sh (no recompile), check its
# control data and file list with dpkg-deb (lintian too, when installed),
# check that Depends names the shared libraries Kiln links (oneDNN,
# protobuf-c, libmicrohttpd, nghttp2, libsodium, GnuTLS), unpack it with
# dpkg -x into a temporary root and run the unpacked `kiln --version`
# against the unpacked libkiln.
# usage: test_deb.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
for t in dpkg-deb dpkg-shlibdeps; do
  command -v "$t" > /dev/null || { echo "SKIP: $t not installed (dpkg-dev)"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
deb=$(bash "$src/scripts/make-deb.sh" "$build" "$work")
version=$(sed -n 's/^#define KILN_VERSION_STRING "\(.*\)"/\1/p' "$src/include/kiln/kiln.h")
major=${version%%.*}
arch=$(dpkg --print-architecture)
[ "$(basename "$deb")" = "kiln_${version}_${arch}.deb" ] || { echo "FAIL: package named $deb"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
field() { dpkg-deb --field "$deb" "$1"; }
[ "$(field Package)" = kiln ] || fail "Package '$(field Package)'"
[ "$(field Version)" = "$version" ] || fail "Version '$(field Version)', want $version"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture '$(field Architecture)'"
dpkg-deb --info "$deb" > "$work/info" || fail "dpkg-deb --info"
depends=$(field Depends)
echo "Depends: $depends"
for lib in libdnnl libprotobuf-c libmicrohttpd libnghttp2 libsodium libgnutls libc6; do
  # a package name followed by its version constraint, e.g. "libsodium23 (>= 1.0.14)"
  echo "$depends" | tr ',' '\n' | grep -Eq "^ *$lib[0-9a-z.+-]* \(>= " ||
    fail "Depends does not name $lib with a version: $depends"
done
# libkiln is inside the package, so no package may be asked for it
echo "$depends" | grep -q libkiln && fail "Depends names libkiln: $depends"
dpkg-deb --contents "$deb" > "$work/contents"
libdir=
for d in usr/lib usr/lib64 "usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x)"; do
  grep -q " ./$d/libkiln.so.$version\$" "$work/contents" && libdir=$d
done
[ -n "$libdir" ] || { cat "$work/contents"; fail "no libkiln.so.$version in the package"; }
for f in usr/bin/kiln "$libdir/libkiln.so.$version" "$libdir/libkiln.so.$major" "$libdir/libkiln.so" \
         usr/include/kiln/kiln.h "$libdir/pkgconfig/kiln.pc" "$libdir/cmake/Kiln/KilnConfig.cmake" \
         "$libdir/cmake/Kiln/KilnConfigVersion.cmake" "$libdir/cmake/Kiln/KilnTargets.cmake" \
         usr/share/doc/kiln/README.md usr/share/doc/kiln/changelog.gz usr/share/doc/kiln/docs/DEPLOY.md; do
  grep -Eq " \./$f( -> .*)?\$" "$work/contents" || fail "$f missing from the package"
done
# files belong to root, and nothing lands outside /usr
awk '{print $2}' "$work/contents" | grep -qv '^root/root$' && fail "a file not owned by root/root"
awk '{print $6}' "$work/contents" | grep -Ev '^\./(usr(/.*)?)?$' && fail "files outside /usr"
if command -v lintian > /dev/null; then
  lintian --no-tag-display-limit "$deb" > "$work/lintian" 2>&1 || true
  grep '^E:' "$work/lintian" && echo "(lintian errors above are reported, not fatal)"
fi
dpkg -x "$deb" "$work/root"
lib="$work/root/$libdir"
soname=$(readelf -d "$lib/libkiln.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkiln.so.$major" ] || fail "SONAME '$soname'"
readelf -S "$lib/libkiln.so.$version" | grep -q '\.debug_info' && fail "libkiln not stripped"
got=$(LD_LIBRARY_PATH="$lib" "$work/root/usr/bin/kiln" --version)
echo "$got" | grep -q "$version" || fail "unpacked kiln --version printed '$got'"
# and it really used the unpacked libkiln, not one installed on this machine
LD_LIBRARY_PATH="$lib" ldd "$work/root/usr/bin/kiln" | grep "libkiln.so.$major" | grep -q "$work/root/" ||
  fail "unpacked kiln does not resolve libkiln from the package"
echo "ok: $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB): $got"
