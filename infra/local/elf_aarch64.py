"""Checks that each file named is a 64-bit little-endian AArch64 ELF executable; exits non-zero
naming what is wrong. The artifact checks run it on the arm64 builds.

Usage: elf_aarch64.py FILE...
"""

import struct
import sys


def check(path):
    with open(path, "rb") as f:
        h = f.read(64)
    problems = []
    if h[:4] != b"\x7fELF":
        return ["no ELF magic"], None
    if h[4] != 2:
        problems.append(f"EI_CLASS {h[4]}, not 64-bit")
    if h[5] != 1:
        problems.append(f"EI_DATA {h[5]}, not little-endian")
    e_type, e_machine = struct.unpack_from("<HH", h, 16)
    if e_machine != 183:
        problems.append(f"e_machine {e_machine}, not EM_AARCH64 (183)")
    if e_type not in (2, 3):
        problems.append(f"e_type {e_type}, not an executable")
    return problems, e_type


def main(paths):
    bad = False
    for path in paths:
        problems, e_type = check(path)
        if problems:
            print(f"{path}: " + "; ".join(problems), file=sys.stderr)
            bad = True
        else:
            print(f"{path}: ELF64 little-endian, e_machine 183 (AArch64), e_type {e_type}")
    return 1 if bad or not paths else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
