#!/usr/bin/env python3
"""Zeroes the device-code entries of an ELF shared library's CUDA fatbin that one GPU generation cannot
use, keeping the file's layout (offsets, sizes, entry headers), so it compresses to a fraction.

    prune_fatbin.py IN.so OUT.so --keep-ptx 90 [--keep-sass 90] [--ptx-version 9.0]

Fatbin layout (the .nv_fatbin section): a run of containers, each a 16-byte header
(u32 magic 0xBA55ED50, u16 version, u16 header size, u64 payload size) followed by entries, each an
entry header (u16 kind: 1 PTX, 2 ELF/SASS; u16 version; u32 header size; u64 payload size; ...; u32 arch
at offset 28) and its payload. Entries kept: PTX whose arch is in --keep-ptx, SASS whose arch is in
--keep-sass. The driver picks, for a device, SASS of its own arch or else the newest PTX at or below it,
and reads only that entry's payload. Refuses (exit 2) a file where the walk does not end exactly at the
section's end, or where nothing would be kept.

--ptx-version V: rewrites the kept PTX's `.version` line to V (why: node-llama-cpp 3.21.1's PTX is ISA 9.1,
from CUDA 13.1, and a CUDA 13.0 driver refuses to compile it, "the provided PTX was compiled with an
unsupported toolchain"; ggml's kernels use nothing of 9.1, which the driver's compile then proves). The
entry (zstd-compressed, entry header: u32 compressed size at 16, u64 uncompressed size at 56) is
decompressed, edited, compressed again with the zstd command and moved to its container's start, its
padded size reaching the container's end, so the container keeps its size and holds that one entry.
"""
import argparse
import re
import struct
import subprocess
import sys

MAGIC = 0xBA55ED50


def section(data, want):
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit("prune_fatbin: not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stroff = secs[shstrndx][4]
    for name, _typ, _flags, _addr, off, size in secs:
        end = data.index(b"\0", stroff + name)
        if data[stroff + name:end].decode() == want:
            return off, size
    raise SystemExit(f"prune_fatbin: no {want} section")


def zstd(args, payload):
    r = subprocess.run(["zstd", *args], input=payload, capture_output=True)
    if r.returncode != 0:
        raise SystemExit("prune_fatbin: zstd failed: " + r.stderr.decode(errors="replace"))
    return r.stdout


def rewrite_ptx(data, start, cend, version):
    """The container's one kept PTX entry (after pruning: the only one with a payload) with its .version set,
    moved to `start`, padded up to cend."""
    q, kept = start, None
    while q < cend:
        kind, _v, ehs, psize = struct.unpack_from("<HHIQ", data, q)
        if kind == 1 and any(data[q + ehs:q + ehs + psize]):
            if kept is not None:
                raise SystemExit("prune_fatbin: --ptx-version with two PTX entries in a container")
            kept = (q, ehs, psize)
        q += ehs + psize
    if kept is None:
        return
    q, ehs, psize = kept
    header = bytearray(data[q:q + ehs])
    flags = struct.unpack_from("<Q", header, 40)[0]
    csize, usize = struct.unpack_from("<I", header, 16)[0], struct.unpack_from("<Q", header, 56)[0]
    if not flags & 0x8000 or ehs < 64:
        raise SystemExit("prune_fatbin: --ptx-version expects zstd-compressed PTX entries")
    ptx = zstd(["-dc"], bytes(data[q + ehs:q + ehs + csize]))
    if len(ptx) != usize:
        raise SystemExit("prune_fatbin: a PTX entry's size does not match its header")
    ptx, n = re.subn(rb"^\.version [0-9]+\.[0-9]+", b".version " + version, ptx, count=1, flags=re.M)
    if n != 1:
        raise SystemExit("prune_fatbin: a PTX entry without a .version line")
    comp = zstd(["-19", "-c", "--no-check"], ptx)
    # The entry's padded payload size reaches the container's end (the compressed size says how much of
    # it is data): one entry fills the container, which so keeps its size.
    if start + ehs + len(comp) > cend:
        raise SystemExit("prune_fatbin: the edited PTX does not fit its container")
    struct.pack_into("<Q", header, 8, cend - start - ehs)
    struct.pack_into("<I", header, 16, len(comp))
    struct.pack_into("<Q", header, 56, len(ptx))
    data[start:cend] = bytes(cend - start)
    data[start:start + ehs] = header
    data[start + ehs:start + ehs + len(comp)] = comp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--keep-ptx", type=int, action="append", default=[])
    ap.add_argument("--keep-sass", type=int, action="append", default=[])
    ap.add_argument("--ptx-version", default=None)
    a = ap.parse_args()
    if a.ptx_version is not None and not re.fullmatch(r"[0-9]+\.[0-9]+", a.ptx_version):
        raise SystemExit("prune_fatbin: --ptx-version wants MAJOR.MINOR")
    data = bytearray(open(a.src, "rb").read())
    off, size = section(data, ".nv_fatbin")
    p, end = off, off + size
    kept = {}
    zeroed = 0
    while p < end:
        if not any(data[p:end]):  # zero padding up to the section's end
            break
        if p + 16 > end:
            raise SystemExit("prune_fatbin: truncated container header")
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, p)
        if magic != MAGIC:  # padding between containers
            if any(data[p:p + 8]):
                raise SystemExit(f"prune_fatbin: unexpected bytes at {p:#x}")
            p += 8
            continue
        q, cend = p + hsize, p + hsize + fsize
        if cend > end:
            raise SystemExit("prune_fatbin: container past the section's end")
        while q < cend:
            kind, _v, ehs, psize = struct.unpack_from("<HHIQ", data, q)
            arch = struct.unpack_from("<I", data, q + 28)[0]
            if ehs < 32 or q + ehs + psize > cend:
                raise SystemExit(f"prune_fatbin: bad entry at {q:#x}")
            keep = (kind == 1 and arch in a.keep_ptx) or (kind == 2 and arch in a.keep_sass)
            k = ("ptx" if kind == 1 else "sass" if kind == 2 else f"kind{kind}", arch)
            if keep:
                kept[k] = kept.get(k, 0) + 1
            else:
                data[q + ehs:q + ehs + psize] = bytes(psize)
                zeroed += psize
            q += ehs + psize
        if q != cend:
            raise SystemExit("prune_fatbin: entries do not fill their container")
        if a.ptx_version is not None:
            rewrite_ptx(data, p + hsize, cend, a.ptx_version.encode())
        p = cend
    if p > end:
        raise SystemExit("prune_fatbin: the walk did not end at the section's end")
    if not kept:
        print("prune_fatbin: nothing would be kept", file=sys.stderr)
        sys.exit(2)
    open(a.dst, "wb").write(data)
    print(f"prune_fatbin: kept {kept}; zeroed {zeroed / 1e6:.1f} MB of {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
