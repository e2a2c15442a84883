#!/usr/bin/env python3
"""Seeds from a fabric capture: the MADs (QP0/QP1 packets) of a pcapng or
pcap the fabric wrote (`--capture`, ERF type-21 records, link type 197),
each written as a raw-MAD input of the `mad_recv` and `sa_response`
targets: b"MAD0" then the 256 MAD bytes (those targets take that form
besides their structured one).

    fuzz/seeds/from-capture.py CAPTURE [OUT_DIR]   # default fuzz/seeds

SMPs and GMPs go to mad_recv/, SA responses (class 3, method bit 7) also to
sa_response/; duplicates are written once.
"""
import hashlib
import os
import struct
import sys


def packets(path):
    data = open(path, "rb").read()
    magic = data[:4]
    if magic == b"\x0a\x0d\x0d\x0a":  # pcapng
        off = 0
        le = True
        while off + 12 <= len(data):
            bom = data[off + 8:off + 12]
            if data[off:off + 4] == b"\x0a\x0d\x0d\x0a":
                le = bom == b"\x4d\x3c\x2b\x1a"
            e = "<" if le else ">"
            btype, blen = struct.unpack(e + "II", data[off:off + 8])
            if blen < 12:
                break
            if btype == 6:  # enhanced packet block
                caplen = struct.unpack(e + "I", data[off + 20:off + 24])[0]
                yield data[off + 28:off + 28 + caplen]
            off += blen
    else:  # classic pcap
        e = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        off = 24
        while off + 16 <= len(data):
            caplen = struct.unpack(e + "I", data[off + 8:off + 12])[0]
            yield data[off + 16:off + 16 + caplen]
            off += 16 + caplen


def mad_of(erf):
    if len(erf) < 16:
        return None
    rtype = erf[8]
    off = 16
    while rtype & 0x80 and off + 8 <= len(erf):  # extension headers
        rtype = erf[off]
        off += 8
    if rtype & 0x7F != 21:
        return None
    ib = erf[off:]
    if len(ib) < 8 + 12 + 8 + 256:
        return None
    lnh = ib[1] & 3
    p = 8 + (40 if lnh == 3 else 0)
    if lnh not in (2, 3):
        return None
    bth = ib[p:p + 12]
    dqp = int.from_bytes(bth[5:8], "big")
    if dqp not in (0, 1) or len(ib) < p + 12 + 8 + 256:
        return None
    return ib[p + 20:p + 20 + 256]


def main():
    cap = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(__file__))
    counts = {}
    for pkt in packets(cap):
        mad = mad_of(pkt)
        if mad is None:
            continue
        dirs = ["mad_recv"]
        if mad[1] == 0x03 and mad[3] & 0x80:
            dirs.append("sa_response")
        body = b"MAD0" + mad
        name = hashlib.sha1(body).hexdigest()[:16]
        for d in dirs:
            os.makedirs(os.path.join(out, d), exist_ok=True)
            path = os.path.join(out, d, "cap-" + name)
            if not os.path.exists(path):
                open(path, "wb").write(body)
                counts[d] = counts.get(d, 0) + 1
    for d, n in sorted(counts.items()):
        print(f"{d}: {n} new seeds")


if __name__ == "__main__":
    main()
