#!/usr/bin/env bash
# test_install.sh - `make install` end to end: install this build into a
# DESTDIR, check the files (tool, libkiln with its SONAME and version,
# header, kiln.pc, CMake package), then build a tiny C program against the
# installed copy twice -- with pkg-config and with find_package(Kiln) --
# and run it: it must load an ONNX model y = 2x + 1 from memory and
# compute 2x + 1, and report the header's version. The installed tool must
# run from the DESTDIR (its rpath is $ORIGIN/../lib).
# usage: test_install.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/dest"
prefix=/usr/local
DESTDIR="$dest" cmake --install "$build" --prefix "$prefix" > "$work/install.log"
root="$dest$prefix"
libdir=
for d in lib lib64 lib/x86_64-linux-gnu; do
  if [ -z "$libdir" ] && [ -e "$root/$d/pkgconfig/kiln.pc" ]; then libdir=$d; fi
done
[ -n "$libdir" ] || { echo "FAIL: no kiln.pc installed"; cat "$work/install.log"; exit 1; }
version=$(sed -n 's/^#define KILN_VERSION_STRING "\(.*\)"/\1/p' "$root/include/kiln/kiln.h")
major=${version%%.*}
for f in bin/kiln include/kiln/kiln.h "$libdir/libkiln.so" "$libdir/libkiln.so.$major" \
         "$libdir/libkiln.so.$version" "$libdir/pkgconfig/kiln.pc" \
         "$libdir/cmake/Kiln/KilnConfig.cmake" "$libdir/cmake/Kiln/KilnConfigVersion.cmake" \
         "$libdir/cmake/Kiln/KilnTargets.cmake"; do
  [ -e "$root/$f" ] || { echo "FAIL: $prefix/$f not installed"; exit 1; }
done
soname=$(readelf -d "$root/$libdir/libkiln.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkiln.so.$major" ] || { echo "FAIL: SONAME '$soname'"; exit 1; }
# the installed tool runs from where it lies
"$root/bin/kiln" --help > /dev/null
# a model y = 2x + 1 as bytes, written by onnx (the program loads it from memory)
/usr/bin/python3 - "$work/affine.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
inits = [numpy_helper.from_array(np.array(2.0, np.float32), "a"),
         numpy_helper.from_array(np.array(1.0, np.float32), "b")]
nodes = [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
onnx.save(helper.make_model(helper.make_graph(nodes, "affine", [x], [y], inits),
                            opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
cat > "$work/app.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <kiln/kiln.h>
int main(int argc, char **argv)
{
    FILE *f = fopen(argv[1], "rb");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    kiln_model *m;
    kiln_session *s;
    if (kiln_model_load_memory(buf, n, NULL, &m) != KILN_OK ||
        kiln_session_create(m, NULL, NULL, &s) != KILN_OK) {
        fprintf(stderr, "app: %s\n", kiln_last_error());
        return 1;
    }
    int64_t dims[2] = {1, 3};
    kiln_tensor *x;
    if (kiln_tensor_create(KILN_DTYPE_F32, 2, dims, &x) != KILN_OK) return 1;
    float *xv = x->data;
    xv[0] = 1.0f, xv[1] = -2.0f, xv[2] = 0.5f;
    kiln_named_tensor in = {"x", x};
    kiln_outputs *out;
    if (kiln_session_run(s, &in, 1, &out) != KILN_OK) {
        fprintf(stderr, "app: %s\n", kiln_last_error());
        return 1;
    }
    const float *yv = kiln_outputs_get(out, 0)->data;
    printf("%s %g %g %g\n", strcmp(kiln_version(), KILN_VERSION_STRING) == 0 ? "same" : "differ",
           yv[0], yv[1], yv[2]);
    kiln_outputs_free(out);
    kiln_tensor_free(x);
    kiln_session_free(s);
    kiln_model_free(m);
    return 0;
}
C
want="same 3 -3 2"
# a sanitizer build's libkiln needs the program built with the same runtimes
san=
if readelf -d "$root/$libdir/libkiln.so.$version" | grep -q 'libasan'; then
  san="-fsanitize=address,undefined"
fi
export PKG_CONFIG_PATH="$root/$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$dest"
[ "$(pkg-config --modversion kiln)" = "$version" ] || { echo "FAIL: pkg-config version"; exit 1; }
# shellcheck disable=SC2046,SC2086
cc -std=c11 -Wall -Werror $san "$work/app.c" -o "$work/app" $(pkg-config --cflags --libs kiln)
got=$(LD_LIBRARY_PATH="$root/$libdir" "$work/app" "$work/affine.onnx")
[ "$got" = "$want" ] || { echo "FAIL: pkg-config build printed '$got', want '$want'"; exit 1; }
mkdir "$work/cm"
cat > "$work/cm/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.20)
project(app C)
find_package(Kiln $version CONFIG REQUIRED)
add_executable(app $work/app.c)
target_link_libraries(app PRIVATE Kiln::kiln)
CM
cmake -S "$work/cm" -B "$work/cm/build" -DCMAKE_PREFIX_PATH="$root" -DCMAKE_C_FLAGS="$san" > "$work/cm.log" 2>&1 ||
  { cat "$work/cm.log"; exit 1; }
cmake --build "$work/cm/build" > "$work/cmb.log" 2>&1 || { cat "$work/cmb.log"; exit 1; }
got=$(LD_LIBRARY_PATH="$root/$libdir" "$work/cm/build/app" "$work/affine.onnx")
[ "$got" = "$want" ] || { echo "FAIL: CMake build printed '$got', want '$want'"; exit 1; }
echo "ok: installed $version (SONAME $soname) builds and runs with pkg-config and find_package"
