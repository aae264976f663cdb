"""Where the intra kernel's warps wait, per source line: Nsight Compute's per-SASS source page of one op call joined,
instruction by instruction, with an offline build of the same kernel (Triton 3.6, ``nvdisasm -g`` line info; the
script checks that the opcodes agree at every index). Samples attributed to Triton's own ``standard.py`` (reductions,
scans) are also listed by the nearest lines of ``intra.py`` around them.

On the H200 (32K tokens, the op's build: stored scores and dense Ct in 128-row tiles, no kept blocks, 128 registers)::

    ncu --profile-from-start off --kernel-name regex:"sparse_gdn_fwd_kernel_intra" --section WarpStateStats \
        --section SourceCounters --import-source no -o intra python3 scripts/profile_gdn.py --tokens 32768
    ncu --import intra.ncu-rep --csv --page source --print-source sass > intra_sass.csv

Then here: ``PYTHONPATH=<triton 3.6>:src python -P intra_stalls.py intra_sass.csv`` (``KEPT=1`` builds the form that
stores the kept blocks). ``intra_stalls_32k.txt`` is its output for the profile of 2026-12-01 23:08 UTC (``5674151``,
the previous block's inverse still recomputed).
"""
import csv, collections, os, re, subprocess, sys, tempfile
sys.path.insert(0, "scripts")
import kernel_report as kr
import triton
from longsparse.ops.gdn import intra
ptrs = dict(k="*bf16", v="*bf16", g="*fp32", beta="*fp32", ct="*bf16", gamma="*fp32", score="*fp32",
            chunk_bos="*i32", chunk_len="*i32", q="*bf16", scores="*bf16")
cons = dict(H=16, HV=32, K=128, V=128, IEEE=False, TF32X3=False, STORE_SCORES=True, SCORE_ROWS=128,
            STORE_KEPT=os.environ.get("KEPT", "0") == "1")
r = kr.compile_report(intra.sparse_gdn_fwd_kernel_intra_blocks, ptrs, cons, num_warps=4, maxnreg=128)
print("regs", r["regs"], "spills", r["spill_bytes"], "shared", r["shared"])
cubin = r["compiled"].asm["cubin"]
nvd = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(cubin)
out = subprocess.run([nvd, "-gi", "-c", f.name], capture_output=True, text=True).stdout
sass = []
cur = None
for line in out.splitlines():
    m = re.search(r'//## File "([^"]+)", line (\d+)', line)
    if m:
        cur = (os.path.basename(m.group(1)), int(m.group(2)))
        continue
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
        sass.append((m.group(2).strip(), cur))
if len(sys.argv) < 2:
    sys.exit(0)
rows = list(csv.reader(open(sys.argv[1])))
h = rows[1]; data = [r for r in rows[2:] if len(r) >= len(h)]
ix = {n: i for i, n in enumerate(h)}
print("profiled", len(data), "offline", len(sass))
def op(s): return re.sub(r"^@!?U?P\w+\s+", "", s).split()[0].split(".")[0] if s.strip() else "?"
mism = sum(op(a[ix["Source"]]) != op(b[0]) for a, b in zip(data, sass))
print("opcode mismatches", mism)
by_line = collections.Counter(); ex_line = collections.Counter(); ops_line = collections.defaultdict(collections.Counter)
total = 0
for a, b in zip(data, sass):
    s = int(a[ix["Warp Stall Sampling (All Samples)"]] or 0); total += s
    key = b[1]
    by_line[key] += s; ex_line[key] += int(a[ix["Instructions Executed"]] or 0); ops_line[key][op(b[0])] += s
for key, v in by_line.most_common(40):
    print(f"{100*v/total:5.1f}%  exec {ex_line[key]:>9d}  {key}  {dict(ops_line[key].most_common(4))}")
print("--- standard.py samples by the nearest intra.py line before / after")
prev = None; seq = []
for i, (txt, key) in enumerate(sass):
    seq.append(key)
near = collections.Counter()
for i, (a, b) in enumerate(zip(data, sass)):
    key = b[1]
    if key and key[0] != "intra.py":
        j = i
        while j >= 0 and (sass[j][1] is None or sass[j][1][0] != "intra.py"): j -= 1
        k = i
        while k < len(sass) and (sass[k][1] is None or sass[k][1][0] != "intra.py"): k += 1
        before = sass[j][1][1] if j >= 0 else None
        after = sass[k][1][1] if k < len(sass) else None
        near[(key[1], before, after)] += int(a[ix["Warp Stall Sampling (All Samples)"]] or 0)
for k, v in near.most_common(25): print(f"{100*v/total:5.1f}%  std line {k[0]}  between intra lines {k[1]} and {k[2]}")
