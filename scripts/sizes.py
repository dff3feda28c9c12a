#!/usr/bin/env python3
"""Size limits of the sources: files over 700 lines, functions over 80 lines (the MurmurHash3
reference port excepted); every file opens with a comment line on what it owns; and every test
file of a test binary keeps its code in a namespace named after the file (uvbus::<file stem>, or
one nested in uvbus::...), since the unity builds put several files in one translation unit, where
helpers of the same name in one namespace would clash or, worse, silently overload each other.
Heuristic: a function body is a '{' ending a line at indentation 0 or 2 (namespace-level or
in-class definition) up to the '}' at the same indentation. Exit 1 if any."""
import re, subprocess, sys

FILE_LIMIT, FN_LIMIT = 700, 80
EXEMPT = {"src/core/murmur3.cpp"}
files = subprocess.run(["git", "ls-files", "src", "include", "tools", "benchmark", "examples", "test"],
                       capture_output=True, text=True, check=True).stdout.split()
bad = 0
for f in files:
    if not f.endswith((".cpp", ".h")) or f in EXEMPT:
        continue
    lines = open(f, encoding="utf-8").read().split("\n")
    if not lines[0].startswith("//"):
        print(f"{f}:1: does not open with a comment line on what it owns"); bad += 1
    if len(lines) > FILE_LIMIT:
        print(f"{f}: {len(lines)} lines (limit {FILE_LIMIT})"); bad += 1
    # Test files (test/<component>/*.cpp; not the fuzz targets, the consumer or test/pch.cpp).
    parts = f.split("/")
    if (parts[0] == "test" and len(parts) > 2 and f.endswith(".cpp")
            and parts[1] not in ("fuzz", "consumer")):
        stem = f.rsplit("/", 1)[1][:-4]
        depth, outer = 0, 0  # namespaces open (clang-format keeps their contents unindented)
        for i, l in enumerate(lines):
            if re.match(r"^namespace\b.*\{$", l):
                if depth == 0:
                    outer += 1
                    if not re.match(r"^namespace uvbus(::\w+)*::" + stem + r" \{$", l):
                        print(f"{f}:{i + 1}: '{l}' at file scope: want uvbus[::...]::{stem}"); bad += 1
                depth += 1
            elif l.startswith("}  // namespace"):
                depth -= 1
        if outer == 0:
            print(f"{f}: its code is in no namespace (want uvbus::{stem})"); bad += 1
    start = None
    for i, l in enumerate(lines):
        m = re.match(r"^( {0,2})\S.*\)\s*(const)?\s*(noexcept)?\s*(override)?\s*\{$", l)
        if start is None and m and not re.match(r"^\s*(if|for|while|switch|else|do)\b", l):
            start, indent = i, m.group(1)
        elif start is not None and l == indent + "}":
            n = i - start - 1
            if n > FN_LIMIT:
                print(f"{f}:{start + 1}: function of {n} lines (limit {FN_LIMIT}): {lines[start].strip()[:70]}")
                bad += 1
            start = None
sys.exit(1 if bad else 0)
