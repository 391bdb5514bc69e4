#!/usr/bin/env bash
# tools/prune_fatbin.py on a small ELF file written here with a .nv_fatbin section of two containers (PTX for
# compute_80 and compute_90, SASS for sm_89; zstd-compressed PTX, as node-llama-cpp's libggml-cuda.so has):
# the output keeps the file's size and the fatbin's walk, holds only compute_90's PTX with its .version
# rewritten (the rest of the text unchanged) and no byte of the other entries; a file without the section,
# or one where nothing would be kept, is refused.
set -euo pipefail
tool=${STRATA_SOURCE_DIR:?}/tools/prune_fatbin.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
python3 - <<'PY'
import struct, subprocess

def zstd(b):
    return subprocess.run(["zstd", "-19", "-c", "--no-check"], input=b, capture_output=True, check=True).stdout

def entry(kind, arch, payload, usize=0, compressed=True):
    ehs = 80 if kind == 1 else 64
    padded = (len(payload) + 7) // 8 * 8
    h = bytearray(ehs)
    struct.pack_into("<HHIQ", h, 0, kind, 0x101, ehs, padded)
    struct.pack_into("<I", h, 16, len(payload))
    struct.pack_into("<I", h, 28, arch)
    struct.pack_into("<Q", h, 40, 0x8011 if compressed else 0x11)
    struct.pack_into("<Q", h, 56, usize)
    return bytes(h) + payload + bytes(padded - len(payload))

def container(entries):
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body

ptx = {a: (f"\n\n.version 9.1\n.target sm_{a}\n.address_size 64\n// kernel {a}\n" + "mov.u32 %r1, 0;\n" * 50).encode() + b"\0"
       for a in (80, 90)}
sass = b"\x7fELF-sm_89-" + bytes(range(256)) * 4
fat = b""
for i in range(2):
    c = container([entry(1, 80, zstd(ptx[80]), len(ptx[80])), entry(2, 89, sass, compressed=False),
                   entry(1, 90, zstd(ptx[90] + b"x" * i), len(ptx[90]) + i)])
    fat += c + bytes(8)  # padding between containers, as nvcc leaves it
open("ptx90.txt", "wb").write(ptx[90])

def elf(sections):  # [(name, bytes)] -> ELF64 with those sections and a .shstrtab
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _ in sections) + b".shstrtab\0"
    data, offs, off = b"", [], 64
    for _, b in sections + [("", names)]:
        offs.append(off + len(data)); data += b
    shoff = 64 + len(data)
    hdr = bytearray(64)
    hdr[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", hdr, 0x28, shoff)
    struct.pack_into("<HHH", hdr, 0x3A, 64, len(sections) + 2, len(sections) + 1)
    sh = bytes(64)
    name_off = 1
    for (n, b), o in zip(sections, offs):
        sh += struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, o, len(b), 0, 0, 1, 0); name_off += len(n) + 1
    sh += struct.pack("<IIQQQQIIQQ", name_off, 3, 0, 0, offs[-1], len(names), 0, 0, 1, 0)
    return bytes(hdr) + data + sh

open("in.so", "wb").write(elf([(".text", b"\x90" * 100), (".nv_fatbin", fat)]))
open("nofat.so", "wb").write(elf([(".text", b"\x90" * 100)]))
open("sass.bin", "wb").write(sass)
PY
python3 "$tool" in.so out.so --keep-ptx 90 --ptx-version 9.0 | tee log
grep -q "kept {('ptx', 90): 2}" log
[ "$(stat -c %s in.so)" = "$(stat -c %s out.so)" ]
python3 - <<'PY'
import struct, subprocess
d = open("out.so", "rb").read()
want = open("ptx90.txt", "rb").read().replace(b".version 9.1", b".version 9.0")
assert open("sass.bin", "rb").read()[:64] not in d, "SASS bytes left"
p, found = d.index(struct.pack("<I", 0xBA55ED50)), 0
while True:
    magic, _v, hs, fs = struct.unpack_from("<IHHQ", d, p)
    assert magic == 0xBA55ED50
    q, end, n = p + hs, p + hs + fs, 0
    while q < end:
        kind, _, ehs, psize = struct.unpack_from("<HHIQ", d, q)
        assert (kind, struct.unpack_from("<I", d, q + 28)[0]) == (1, 90), "only compute_90's PTX is left"
        cs, us = struct.unpack_from("<I", d, q + 16)[0], struct.unpack_from("<Q", d, q + 56)[0]
        text = subprocess.run(["zstd", "-dc"], input=d[q + ehs:q + ehs + cs], capture_output=True, check=True).stdout
        assert len(text) == us and text == want + b"x" * found, text[:80]
        q += ehs + psize; n += 1
    assert q == end and n == 1
    found += 1
    nxt = d.find(struct.pack("<I", 0xBA55ED50), end)
    if nxt < 0: break
    p = nxt
assert found == 2
print("walk ok")
PY
# Refusals: no fatbin section; nothing to keep (exit 2); a bad --ptx-version.
if python3 "$tool" nofat.so x.so --keep-ptx 90 2>err; then echo "no section: accepted"; exit 1; fi
grep -q "no .nv_fatbin section" err
set +e
python3 "$tool" in.so x.so --keep-ptx 75 2>err; rc=$?
set -e
[ $rc = 2 ] && grep -q "nothing would be kept" err
if python3 "$tool" in.so x.so --keep-ptx 90 --ptx-version nine 2>err; then echo "bad version: accepted"; exit 1; fi
echo "prune_fatbin: ok"
