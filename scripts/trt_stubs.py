"""Make the tensorrt-stubs package usable by mypy: copy its stub files to DEST and repair them.

tensorrt-stubs installs ``tensorrt/__init__.pyi`` without a py.typed marker (so mypy skips it)
and its generated ``tensorrt_bindings/tensorrt.pyi`` has a few lines that are not valid
Python: parameters named ``in`` and a non-default parameter after defaulted ones. This copies
both packages into DEST (use it as MYPYPATH) and rewrites just those lines.

Usage: python scripts/trt_stubs.py DEST
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
import sysconfig
from pathlib import Path


def _fix_def(line: str) -> str:
    line = re.sub(r"([(,]\s*)in:", r"\1in_:", line)
    match = re.match(r"(\s*def \w+\()(.*)(\)\s*->.*)$", line)
    if not match:
        return line
    params, seen_default, out = match.group(2).split(", "), False, []
    for p in params:
        if "=" in p:
            seen_default = True
        elif seen_default and ":" in p and not p.strip().startswith("*"):
            p = p + " = ..."
        out.append(p)
    return match.group(1) + ", ".join(out) + match.group(3)


def main(dest: str) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    target = Path(dest)
    if target.exists():
        shutil.rmtree(target)
    for pkg in ("tensorrt", "tensorrt_bindings"):
        shutil.copytree(site / pkg, target / pkg)
    for stub in target.rglob("*.pyi"):
        text = stub.read_text().splitlines()
        lines = [(_fix_def(line) if line.lstrip().startswith("def ") else line) for line in text]
        stub.write_text("\n".join(lines) + "\n")
        ast.parse(stub.read_text(), filename=str(stub))  # fail loudly if anything is still broken


if __name__ == "__main__":
    main(sys.argv[1])
