#!/usr/bin/env python3
"""The TensorFlow importer's layering (docs/ARCHITECTURE.md, src/import/tf_import.h).

savedmodel.c reads a SavedModel and hands the graph to the lowering (tf_graph.c,
tf_lower*.c, tf_control.c, tf_v1_control.c, tf_keras_rnn.c) through tf_import.h;
the lowering never includes savedmodel.h nor calls a function savedmodel.c
defines. And tf_ops.def names each TF op once (a second row would never be used).

Usage: check_tf_import.py SRC_IMPORT_DIR. Exits 1 naming every violation.
"""
import os
import re
import sys


def strip_comments(text):
    text = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), text, flags=re.S)
    return re.sub(r'//[^\n]*', '', text)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else 'src/import'
    problems = []
    reader = strip_comments(open(os.path.join(d, 'savedmodel.c')).read())
    # functions savedmodel.c defines with external linkage
    defined = set(re.findall(r'^(?!static\b)[A-Za-z_][\w \*]*?\b(\w+)\([^;{]*\)\s*\{', reader, re.M))
    if not defined:
        problems.append('savedmodel.c: found no function definitions (has the file moved?)')
    lowering = sorted(f for f in os.listdir(d)
                      if f.startswith('tf_') and f.endswith(('.c', '.h', '.def')))
    if 'tf_import.h' not in lowering or 'tf_ops.def' not in lowering:
        problems.append('%s: tf_import.h or tf_ops.def is missing' % d)
    for f in lowering:
        text = strip_comments(open(os.path.join(d, f)).read())
        for i, line in enumerate(text.split('\n'), 1):
            if re.search(r'#\s*include\s*["<][^">]*savedmodel\.h[">]', line):
                problems.append('%s:%d includes savedmodel.h' % (f, i))
            for name in defined:
                if re.search(r'\b%s\s*\(' % re.escape(name), line):
                    problems.append('%s:%d calls %s, which savedmodel.c defines' % (f, i, name))
    def_path = os.path.join(d, 'tf_ops.def')
    ops = re.findall(r'^TF_OP\((\w+),', strip_comments(open(def_path).read()), re.M) \
        if os.path.exists(def_path) else []
    if len(ops) < 100:
        problems.append('tf_ops.def: only %d rows found' % len(ops))
    seen = set()
    for op in ops:
        if op in seen:
            problems.append('tf_ops.def: op %s has more than one row' % op)
        seen.add(op)
    for p in problems:
        print(p)
    print('%d lowering files checked against %d functions of savedmodel.c; %d ops in tf_ops.def; '
          '%d problems' % (len(lowering), len(defined), len(ops), len(problems)))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
