#!/usr/bin/env python3
"""check_exports.py - libkiln.so exports exactly the API its headers declare.

libkiln is compiled with hidden visibility (CMakeLists.txt) and exports what
include/kiln/*.h marks KILN_API: the public API of kiln.h and the internal
utilities of kiln_util.h that Kiln's own server and tool use
(docs/ARCHITECTURE.md, "The API boundary"). This check reads the library's
dynamic symbol table with `nm -D --defined-only` and fails, naming the
symbols, when
  - the library exports a symbol no header declares (an internal leaking out,
    or a declaration that lost its KILN_API marker's header),
  - a function a header declares with KILN_API is not exported (a definition
    that does not see its declaration, so it stayed hidden),
  - a header under include/kiln/ declares a function without KILN_API.

Usage: check_exports.py LIBKILN_SO INCLUDE_DIR
"""

import re
import subprocess
import sys
from pathlib import Path

# Symbols the toolchain defines in every shared object, and the ones the
# sanitizer build's instrumentation adds (AddressSanitizer's ODR indicators
# and module bookkeeping), none of them Kiln's.
TOOLCHAIN = {"_init", "_fini", "_edata", "_end", "__bss_start"}
TOOLCHAIN_PREFIXES = ("__odr_asan", "__asan", "__sanitizer", "___asan")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def declared(include_dir):
    """(functions marked KILN_API, function declarations without it) per header."""
    marked, unmarked = {}, []
    for header in sorted(Path(include_dir).glob("*.h")):
        text = strip_comments(header.read_text())
        text = re.sub(r"#ifdef __cplusplus.*?#endif", " ", text, flags=re.S)  # extern "C" { }
        text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)       # preprocessor lines
        # Top-level statements: split at ';' and at bodies (static inline functions).
        depth, stmt, stmts = 0, [], []
        for ch in text:
            if ch == "{":
                if depth == 0:
                    stmts.append("".join(stmt) + "{")
                    stmt = []
                depth += 1
            elif ch == "}":
                depth -= 1
            elif depth == 0:
                if ch == ";":
                    stmts.append("".join(stmt))
                    stmt = []
                else:
                    stmt.append(ch)
        for s in stmts:
            s = " ".join(s.split())
            if s.startswith(("typedef", "struct", "enum", "extern \"C\"")) or "(" not in s:
                continue
            m = re.match(r"(.*?)\b(\w+)\s*\(", s)
            if not m or m.group(2) in ("__attribute__",):
                continue
            name = m.group(2)
            if s.startswith("static "):
                continue                                       # static inline: not a symbol
            if "KILN_API" in m.group(1):
                marked[name] = header.name
            else:
                unmarked.append(f"{header.name}: {name}")
    return marked, unmarked


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        name = parts[2].split("@")[0]
        if name in TOOLCHAIN or name.startswith(TOOLCHAIN_PREFIXES):
            continue
        names.add(name)
    return names


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    lib, include_dir = sys.argv[1], sys.argv[2]
    marked, unmarked = declared(include_dir)
    names = exported(lib)
    problems = []
    for name in sorted(names - set(marked)):
        problems.append(f"exported but declared in no include/kiln header: {name}")
    for name in sorted(set(marked) - names):
        problems.append(f"declared KILN_API in {marked[name]} but not exported: {name}")
    for decl in unmarked:
        problems.append(f"declared without KILN_API: {decl}")
    if not marked:
        problems.append(f"no KILN_API declarations found under {include_dir}")
    for p in problems:
        print(p)
    print(f"{lib}: {len(names)} exported symbols, {len(marked)} KILN_API functions declared, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
