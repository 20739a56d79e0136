#!/usr/bin/env python3
"""Rewrites the memest and difference cells of docs/published.md from the built binary.

Every row of the page's comparison tables gives the `build/bin/memest estimate ...` command that
produced its memest figure; tests/cli/published_test.cc fails when the engine moves one. After
a change to the engine that is meant to move them, run this (from the repository root, after
building) and read the diff: the prose around the tables is yours to update.

Usage: python3 scripts/update-published.py [--check]
"""
import json
import re
import shlex
import subprocess
import sys

PAGE = "docs/published.md"
UNITS = {"memest (MB)": 1e6, "memest (GB)": 1e9}


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def decimals(number):
    return len(number.split(".")[1]) if "." in number else 0


def main():
    check = "--check" in sys.argv[1:]
    lines = open(PAGE).read().split("\n")
    unit, changed = None, 0
    for n, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        c = cells(line)
        if len(c) >= 3 and c[2] in UNITS:
            unit = UNITS[c[2]]
            continue
        m = re.fullmatch(r"`(build/bin/memest estimate .*)`", c[-1]) if c else None
        if not m or unit is None:
            continue
        out = subprocess.run(shlex.split(m.group(1)) + ["--json"], capture_output=True,
                             text=True, check=True).stdout
        value = int(json.loads(out)["peak"]["allocatedBytes"]) / unit
        memest = "%.*f" % (decimals(c[2]), value)
        published = float(c[1])
        diff = "%+.2f%%" % (100 * (value - published) / published)
        if (memest, diff) != (c[2], c[3]):
            changed += 1
            print("%s:%d %s: %s %s -> %s %s" % (PAGE, n + 1, c[0], c[2], c[3], memest, diff))
            c[2], c[3] = memest, diff
            lines[n] = "| " + " | ".join(c) + " |"
    if changed and not check:
        open(PAGE, "w").write("\n".join(lines))
    print("%d rows %s" % (changed, "differ" if check else "rewritten"))
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
