"""Where the Gluon walk's warps wait, per SASS instruction and per source line: joins Nsight Compute's source page
(warp-stall samples per SASS address) with an offline build of the same kernel (``nvdisasm -g`` line info of
``scripts/gluon_walk_report.py``'s build — same Triton, same source: its opcodes matched the profiled kernel at every
address), and for each instruction stalled on the long scoreboard names the load that produced its operand (a spill
reload ``LDL`` or a global load ``LDG``).

On the H200 (32K tokens, one op call, ``--walk-form single|ws``)::

    ncu --clock-control none --profile-from-start off --kernel-name regex:"sparse_gdn_fwd_kernel_walk_gluon" \\
        --section WarpStateStats --section SourceCounters --section SchedulerStats --import-source no \\
        -o walk_single python3 scripts/profile_gdn.py --tokens 32768 --walk-form single
    ncu --import walk_single.ncu-rep --page source --print-source sass --csv > walk_single_sass.csv

Then here, with Triton 3.6 (``nvdisasm`` ships with it)::

    PYTHONPATH=/work/venv36/lib/python3.11/site-packages:src python -P benchmarks/tuning/2026-12-01/sass_stalls.py \\
        walk_single_sass.csv single [--module PROFILED_walk_gluon_kernel.py --tile-rows 64] > walk_single_stalls.txt

The profile of 2026-12-01 (``walk_gluon_stalls_32k.txt``) is of the walk before Ct moved into the score tiles: the
single-warpgroup kernel of ``64f870e`` and the first warp-specialised kernel (that hour's working tree: ``62e3735``'s
``sparse_gdn_fwd_kernel_walk_gluon_ws`` with Ct gathered into registers and ``R`` whole), with 64-row tiles; the
script checks that the offline build's opcodes equal the profiled ones at every address and stops otherwise.
"""

import collections
import csv
import os
import re
import subprocess
import sys

NVDISASM = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "nvdisasm")


def build_sass(form: str, module: str | None, tile_rows: int) -> str:
    """The SASS of the walk's build (grouped output, 64-wide tiles), from ``module`` (a copy of
    ``walk_gluon_kernel.py`` as it was profiled; None: the tree's) with ``tile_rows``-row score tiles."""
    import importlib.util

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts"))
    import gluon_walk_report

    from longsparse.ops.gdn import walk_gluon

    if module is not None:
        spec = importlib.util.spec_from_file_location("profiled_walk_gluon_kernel", module)
        kern = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kern)
        walk_gluon.kernel_module = lambda: kern
    walk_gluon.TILE_ROWS = tile_rows
    compiled = gluon_walk_report.build(64, True, ws=form == "ws")
    path = f"/tmp/walk_{form}.cubin"
    with open(path, "wb") as f:
        f.write(compiled.asm["cubin"])
    return subprocess.run([NVDISASM, "-c", "-g", path], capture_output=True, text=True, check=True).stdout


def main(profile: str, form: str, module: str | None = None, tile_rows: int = 128, top: int = 30) -> None:
    rows = list(csv.reader(open(profile)))
    header = {h: i for i, h in enumerate(rows[1])}
    data = [r for r in rows[2:] if len(r) > 3 and r[0].startswith("0x")]
    base = int(data[0][0], 16)
    samples = {int(r[0], 16) - base: int(r[2] or 0) for r in data}
    long_sb = {int(r[0], 16) - base: int(r[header["stall_long_sb"]] or 0) for r in data}
    reasons = collections.Counter()
    for r in data:
        for h, i in header.items():
            if h.startswith("stall_") and "Not Issued" not in h:
                reasons[h[6:]] += int(r[i] or 0)
    total = sum(samples.values())
    line, where, code = None, {}, []
    for text in build_sass(form, module, tile_rows).splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if m:
            line = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", text)
        if m:
            where[int(m.group(1), 16)] = line
            code.append((int(m.group(1), 16), m.group(2).strip()))
    profiled = {int(r[0], 16) - base: r[1].split()[:1] for r in data}
    same = sum(1 for a, t in code if profiled.get(a) == t.split()[:1])
    print(f"{profile}: {total} samples; opcodes equal to the offline build at {same} of {len(code)} addresses")
    if same != len(code):
        raise SystemExit("the offline build is not the profiled kernel: pass the profiled source (--module)")
    print("stall reasons: " + ", ".join(f"{k} {v / total:.1%}" for k, v in reasons.most_common(8)))
    by_line = collections.Counter()
    for a, s in samples.items():
        by_line[where.get(a)] += s
    print("\nsamples by source line:")
    for key, s in by_line.most_common(top):
        print(f"  {s / total:6.1%}  {key}")
    position = {a: i for i, (a, _) in enumerate(code)}
    producers = collections.Counter()
    print("\nlong-scoreboard stalls by instruction, with the load that produced an operand:")
    for a, s in sorted(long_sb.items(), key=lambda x: -x[1])[:top]:
        i, text = position[a], code[position[a]][1]
        operands = set(re.findall(r"\bR\d+\b", text.split(None, 1)[1] if " " in text else ""))
        found = "?"
        for j in range(i - 1, max(0, i - 400), -1):
            tj = code[j][1]
            if re.search(r"\b(LDG|LDL)", tj):
                dst = re.findall(r"\bR\d+\b", tj.split(None, 1)[1].split(",")[0])
                width = 2 if ".64" in tj else 4 if ".128" in tj else 1
                if dst and {f"R{int(dst[0][1:]) + k}" for k in range(width)} & operands:
                    found = tj.split()[0]
                    break
        producers[found.split(".")[0]] += s
        print(f"  {s / total:5.1%}  {a:#7x}  {text[:60]:60}  <- {found}")
    print(
        "\nlong-scoreboard samples by producing load: "
        + ", ".join(f"{k} {v / total:.1%}" for k, v in producers.most_common())
    )


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("form", choices=("single", "ws"))
    ap.add_argument("--module", help="the walk_gluon_kernel.py that was profiled (default: the tree's)")
    ap.add_argument("--tile-rows", type=int, default=128, help="rows of its score tiles: 64 before Ct moved into them")
    args = ap.parse_args()
    main(args.profile, args.form, args.module, args.tile_rows)
