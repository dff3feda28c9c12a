#!/usr/bin/env python3
"""clang-tidy over the given files, in parallel, with a cache of clean verdicts (scripts/tidy.sh).

A file's verdict depends only on clang-tidy itself, the .clang-tidy configuration, the file's
compile flags and the text the compiler reads. That text is the file preprocessed with its
comments (NOLINT markers) and macro definitions kept (clang -E -C -dD); its digest, with the
other inputs, names a marker in the cache directory that records "no finding". A file whose
marker exists is not run again; findings are never cached, so a failing file runs every time.

    scripts/tidy.py BUILD_DIR FILE...
    TIDY_CACHE=dir   the cache (default $XDG_CACHE_HOME/uvbus-tidy or ~/.cache/uvbus-tidy);
                     TIDY_CACHE=off runs every file. Markers unused for 30 days are removed.
Prints each finding, then one summary line; exits 1 on any finding.
"""
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

TIDY_ARGS = ["--quiet", "--extra-arg=-std=c++17"]
MAX_AGE_S = 30 * 24 * 3600


def tidy_binary():
    """$CLANG_TIDY, else the newest versioned clang-tidy-N on PATH, else clang-tidy."""
    env = os.environ.get("CLANG_TIDY")
    if env:
        return env
    found = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        for p in glob.glob(os.path.join(d, "clang-tidy-[0-9]*")):
            m = re.fullmatch(r"clang-tidy-(\d+)", os.path.basename(p))
            if m and os.access(p, os.X_OK):
                found.append((int(m.group(1)), p))
    return max(found)[1] if found else "clang-tidy"


TIDY = tidy_binary()


def cache_dir():
    """The cache directory, or None when caching is off."""
    env = os.environ.get("TIDY_CACHE")
    if env == "off":
        return None
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "uvbus-tidy")


def clean_args(args):
    """A compile command without what clang cannot read: a compiler launcher (ccache) in front,
    and GCC's precompiled header (-include .../cmake_pch.hxx, -Winvalid-pch), so that every file
    is checked with its own includes only."""
    while len(args) > 1 and os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    out = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "-include" and i + 1 < len(args) and args[i + 1].endswith("cmake_pch.hxx"):
            skip = True
            continue
        if a == "-Winvalid-pch":
            continue
        out.append(a)
    return out


def compile_args(build, clean_db_dir):
    """Absolute source path -> (directory, argument list) from compile_commands.json; writes the
    cleaned commands (clean_args) to clean_db_dir/compile_commands.json for clang-tidy."""
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    out, db = {}, []
    for e in entries:
        args = clean_args(e.get("arguments") or shlex.split(e["command"]))
        out[os.path.realpath(os.path.join(e["directory"], e["file"]))] = (e["directory"], args)
        db.append({"directory": e["directory"], "file": e["file"], "arguments": args})
    with open(os.path.join(clean_db_dir, "compile_commands.json"), "w", encoding="utf-8") as f:
        json.dump(db, f)
    return out


def preprocess_args(args):
    """The compile command turned into clang's preprocessor, comments and #defines kept."""
    out = ["clang++"]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        out.append(a)
    return out + ["-std=c++17", "-E", "-C", "-dD", "-o", "-"]


def digest(common, path, entry):
    """The cache key of one file, or None when it cannot be preprocessed (then tidy runs)."""
    directory, args = entry
    pre = subprocess.run(preprocess_args(args), cwd=directory, capture_output=True, check=False)
    if pre.returncode != 0:
        return None
    h = hashlib.sha256(common)
    h.update(path.encode() + b"\0" + " ".join(args).encode() + b"\0")
    h.update(pre.stdout)
    return h.hexdigest()


def check(db_dir, cache, common, path, entry):
    """Runs clang-tidy on one file unless a clean verdict is cached; returns its findings."""
    key = digest(common, path, entry) if cache and entry else None
    marker = os.path.join(cache, key) if key else None
    if marker and os.path.exists(marker):
        os.utime(marker)
        return path, [], True
    run = subprocess.run([TIDY, "-p", db_dir, *TIDY_ARGS, path], capture_output=True,
                         text=True, check=False)
    findings = [line for line in run.stdout.splitlines() if "warning:" in line or "error:" in line]
    if run.returncode != 0 and not findings:
        findings = [f"{path}: error: clang-tidy exited {run.returncode}: {run.stderr.strip()[-400:]}"]
    if marker and not findings:
        with open(marker, "w", encoding="utf-8"):
            pass
    return path, findings, False


def prune(cache):
    """Removes markers not used for MAX_AGE_S."""
    now = time.time()
    for name in os.listdir(cache):
        p = os.path.join(cache, name)
        if now - os.path.getmtime(p) > MAX_AGE_S:
            os.remove(p)


def main():
    build, files = sys.argv[1], sys.argv[2:]
    cache = cache_dir()
    if cache:
        os.makedirs(cache, exist_ok=True)
        prune(cache)
    version = subprocess.run([TIDY, "--version"], capture_output=True, check=True).stdout
    # Every configuration file: the top one and the directories' own (test/, benchmark/).
    configs = subprocess.run(["git", "ls-files", "--", ".clang-tidy", "*/.clang-tidy"],
                             capture_output=True, text=True, check=True).stdout.split()
    common = version + b"\0" + " ".join(TIDY_ARGS).encode() + b"\0"
    for name in sorted(configs):
        with open(name, "rb") as f:
            common += name.encode() + b"\0" + f.read() + b"\0"
    findings, reused = [], 0
    with tempfile.TemporaryDirectory() as db_dir:
        entries = compile_args(build, db_dir)
        missing = [f for f in files if os.path.realpath(f) not in entries]
        if missing:
            # Without its own entry clang-tidy would guess a neighbour's flags and check the file
            # against them: refuse instead.
            print(f"clang-tidy: {len(missing)} files are not in {build}/compile_commands.json, "
                  f"first {missing[0]} (a build configured with UVBUS_UNITY_TESTS=ON lists its "
                  "batches instead of the test files: use a directory configured without it, as "
                  "scripts/tidy.sh does)", file=sys.stderr)
            return 2
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            jobs = [pool.submit(check, db_dir, cache, common, os.path.realpath(f),
                                entries.get(os.path.realpath(f))) for f in files]
            for job in jobs:
                _, found, hit = job.result()
                findings += found
                reused += hit
    findings = sorted(set(findings))
    for line in findings:
        print(line, flush=True)
    if findings:
        print(f"clang-tidy: {len(findings)} findings", file=sys.stderr)
        return 1
    print(f"clang-tidy: {len(files)} files clean ({reused} verdicts reused from {cache})"
          if cache else f"clang-tidy: {len(files)} files clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
