#!/usr/bin/env bash
# rootfs.sh - build Kiln's runtime root filesystem: the kiln binary, exactly
# the shared libraries `ldd` lists for it (libkiln included) and the dynamic
# loader, a non-root user (kiln, uid/gid 10001), /models and /tmp. Nothing
# else: no shell, no package manager. deploy/Dockerfile copies this tree
# into a `FROM scratch` image; tests/deploy/test_rootfs.sh runs the server
# from it with `unshare --root`, which is how it is tested where no
# container engine runs.
#
# usage: deploy/rootfs.sh KILN_BINARY OUT_DIR [MODEL_DIR MODEL_NAME]
#   MODEL_DIR (a TF Serving base path: version folders 1/, 2/, ...) is
#   copied to OUT_DIR/models/MODEL_NAME.
set -euo pipefail
if [ $# -ne 2 ] && [ $# -ne 4 ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
bin=$1 out=$2
[ -x "$bin" ] || { echo "rootfs.sh: $bin is not an executable" >&2; exit 1; }
[ -e "$out" ] && { echo "rootfs.sh: $out exists already" >&2; exit 1; }
mkdir -p "$out"/usr/bin "$out"/etc "$out"/models "$out"/tmp
chmod 1777 "$out"/tmp
install -m 0755 "$bin" "$out"/usr/bin/kiln
# every library the loader resolves, at the same path as on the build
# machine (so no ld.so.cache is needed), plus the loader itself
ldd "$bin" | while read -r a b c _; do
  if [ "$b" = "=>" ] && [ -n "$c" ] && [ "${c#/}" != "$c" ]; then lib=$c
  elif [ "${a#/}" != "$a" ]; then lib=$a          # the loader: /lib64/ld-linux-x86-64.so.2
  else continue; fi                                # linux-vdso.so.1 (in the kernel)
  mkdir -p "$out$(dirname "$lib")"
  cp -L "$lib" "$out$lib"
done
# the loader finds libkiln (not in a system folder on the build machine)
# through the binary's RUNPATH: point it at the copied location instead
libkiln=$(ldd "$bin" | awk '$1 == "libkiln.so" || $1 ~ /^libkiln\.so\./ {print $3; exit}')
if [ -n "$libkiln" ] && [ ! -e "$out"/usr/lib/"$(basename "$libkiln")" ]; then
  mkdir -p "$out"/usr/lib
  mv "$out$libkiln" "$out"/usr/lib/
  d=$(dirname "$libkiln")
  while [ "$d" != / ] && rmdir "$out$d" 2>/dev/null; do d=$(dirname "$d"); done
fi
printf 'root:x:0:0:root:/:/sbin/nologin\nkiln:x:10001:10001:kiln:/tmp:/sbin/nologin\n' > "$out"/etc/passwd
printf 'root:x:0:\nkiln:x:10001:\n' > "$out"/etc/group
if [ $# -eq 4 ]; then
  cp -r "$3" "$out"/models/"$4"
  chmod -R a+rX "$out"/models
fi
echo "rootfs.sh: $out: $(find "$out" -type f | wc -l) files, $(du -sh "$out" | cut -f1)"
