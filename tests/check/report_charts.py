#!/usr/bin/env python3
"""Whether the charts of a `stowage report` page drew, read off a screenshot.

    python3 tests/check/report_charts.py PAGE.html SHOT.png

The page draws three canvases with its script (report/report_html.c): memory
over time, allocation lifetimes and stranded memory, each inside a 1-pixel
#dddddd border. Without the script a canvas stays white inside its border.
The check finds the canvases in the screenshot by their borders (rows with a
long run of #dddddd) and counts the coloured pixels inside each (the largest
and smallest channel at least 30 apart: the data; the axes and labels are
grey). The memory and lifetime canvases must each hold at least MIN_COLOURED
of them, and the stranded-memory canvas too when the page's data has
stranded-memory samples (policy classic; else the page has no such canvas).
Prints the counts; exits 0 when all hold, 1 otherwise. Standard library only
(the PNG is decoded here: 8-bit RGB or RGBA, not interlaced, as Chromium writes).
"""

import json
import re
import struct
import sys
import zlib

BORDER = (0xDD, 0xDD, 0xDD)
MIN_BORDER_RUN = 600   # pixels of #dddddd in a row: a canvas's top or bottom edge
MIN_COLOURED = 200     # coloured pixels a drawn canvas holds at least


def read_png(path):
    """(width, height, rows): rows[y] is a bytes of width * channels."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("%s: not a PNG" % path)
    pos, idat, hdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise ValueError("%s: PNG of depth %d, colour type %d, interlace %d not handled"
                         % (path, depth, ctype, interlace))
    ch = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * ch
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        ftype, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - ch] if x >= ch else 0
            b = prev[x]
            c = prev[x - ch] if x >= ch else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 0xFF
            elif ftype == 2:
                line[x] = (line[x] + b) & 0xFF
            elif ftype == 3:
                line[x] = (line[x] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, ch, rows


def has_stranded(html_path):
    with open(html_path, encoding="utf-8") as f:
        m = re.search(r"<script id=data type=application/json>(.*?)</script>", f.read(), re.S)
    if not m:
        raise ValueError("%s: no data block" % html_path)
    return bool(json.loads(m.group(1)).get("stranded", {}).get("ev"))


def _longest_run(line, ch, width, colour):
    best = run = 0
    for x in range(0, width * ch, ch):
        if (line[x], line[x + 1], line[x + 2]) == colour:
            run += 1
            best = max(best, run)
        else:
            run = 0
    return best


def measure(png_path):
    """The canvases found (top to bottom) with their coloured pixels, as
    [(top_row, bottom_row, coloured)]."""
    width, height, ch, rows = read_png(png_path)
    edges = [y for y in range(height) if _longest_run(rows[y], ch, width, BORDER) >= MIN_BORDER_RUN]
    canvases = []
    i = 0
    while i + 1 < len(edges):
        top, bottom = edges[i], edges[i + 1]
        if bottom - top < 20:     # a thick edge, or two edges touching: not a canvas
            i += 1
            continue
        coloured = 0
        for y in range(top + 1, bottom):
            line = rows[y]
            for x in range(0, width * ch, ch):
                r, g, b = line[x], line[x + 1], line[x + 2]
                if max(r, g, b) - min(r, g, b) >= 30:
                    coloured += 1
        canvases.append((top, bottom, coloured))
        i += 2
    return width, height, canvases


def main(argv):
    if len(argv) != 3:
        print("usage: report_charts.py PAGE.html SHOT.png", file=sys.stderr)
        return 2
    width, height, canvases = measure(argv[2])
    names = ["memory", "lifetimes", "stranded"]
    need = names if has_stranded(argv[1]) else names[:2]
    found = dict(zip(names, canvases))
    ok = all(n in found and found[n][2] >= MIN_COLOURED for n in need)
    print("%s: %dx%d, %s: %s" % (
        argv[2], width, height,
        ", ".join("%s canvas rows %d-%d %d coloured pixels" % (n, c[0], c[1], c[2])
                  for n, c in found.items()) or "no canvas found",
        "drawn" if ok else "NOT drawn"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
