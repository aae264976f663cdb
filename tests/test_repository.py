"""The repository holds the product and its current evidence: no large or dated files, no run's provenance in the
product's text, and every relative link in its Markdown resolves (the file, and the heading when the link names one)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_TREE_BYTES = 25 * 1024 * 1024
DATE = re.compile(r"(19|20)\d{2}-\d{2}-\d{2}")


def git(*args: str, stdin: bytes | None = None) -> bytes:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, input=stdin, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")


def tracked_sizes() -> dict[str, int]:
    """Each tracked path's size in git's index (what a commit would hold), whether or not the work tree has it."""
    entries = [e.split("\t", 1) for e in git("ls-files", "-s", "-z").decode().split("\0") if e]
    names = [meta.split()[1] for meta, _ in entries]
    sizes = git("cat-file", "--batch-check=%(objectsize)", stdin="\n".join(names).encode()).decode().split()
    return {path: int(size) for (_, path), size in zip(entries, sizes, strict=True)}


def tracked_files() -> list[Path]:
    return [ROOT / name for name in tracked_sizes() if (ROOT / name).is_file()]


def test_no_tracked_file_is_larger_than_8_mib_and_the_tree_stays_under_25_mib():
    sizes = tracked_sizes()
    large = {name: size for name, size in sizes.items() if size > MAX_FILE_BYTES}
    assert not large, f"tracked files over {MAX_FILE_BYTES} bytes (trained weights belong outside the tree): {large}"
    assert sum(sizes.values()) < MAX_TREE_BYTES, f"tracked files total {sum(sizes.values())} bytes"


def test_no_tracked_folder_is_named_after_a_date():
    dated = sorted(
        {"/".join(parts[: i + 1]) for parts in (Path(name).parts for name in tracked_sizes())
         for i, part in enumerate(parts[:-1]) if DATE.search(part)}
    )  # fmt: skip
    assert not dated, f"dated folders (records of a run belong in results JSON and git history): {dated}"


PRODUCT_TEXT = ("src/", "docs/", "scripts/", "README.md")
STUDY_NOTES = re.compile(r"sparda-notes|sparsegdn-notes|\b[Tt]he notes'|\bnotes (?:Eqs?\.|Secs?\.|§)")
"""A reference to the team's study notes of the papers (not in the repository): the text cites the papers themselves."""
PROVENANCE = re.compile(
    rf"\b(?:19|20)\d{{2}}-\d{{2}}-\d{{2}}\b|DESIGN\.md|benchmarks/tuning(?!/next\b)|{STUDY_NOTES.pattern}"
)
"""An ISO date, the team's design or study notes (not in the repository) or a tuning folder other than ``next/`` (the
dated ones left the tree): what says when or on which run something was found, or points at text outside the
repository, rather than what the code does and why."""


def provenance_lines(root: Path, names: list[str], pattern: re.Pattern = PROVENANCE) -> list[str]:
    """``path:line: text`` of every line of the files ``names`` (relative to ``root``) that ``pattern`` matches; files
    that are not UTF-8 text (images) or not in the work tree are skipped."""
    found = []
    for name in names:
        try:
            lines = (root / name).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        found += [f"{name}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if pattern.search(line)]
    return found


def test_provenance_is_found_and_what_is_not_provenance_is_not(tmp_path):
    planted = {
        "dated.py": '"""H200, 2026-12-02: 1.748 -> 1.509 ms."""',
        "tuning.md": "see ``benchmarks/tuning/intra_variants.json``",
        "tuning_folder.md": "the experiments under benchmarks/tuning",
        "design.md": "as DESIGN.md section 7 says",
        "sparda.py": "# the copy overlaps them (sparda-notes §2.6)",
        "sparsegdn.md": "as sparsegdn-notes.md §3 reports quality",
        "defaults.py": "config: what is computed (default: the notes' defaults).",
        "equation.py": "# M = I + A_Δ (notes Eq. 5)",
        "clean.md": "benchmarks/tuning/next/topk_forms.py; a paper of 2025; shape 2048-64-128; v1.2026-12; release "
        "notes; result.notes += [...]; MODE_NOTES; the paper's Eq. 5 (SparseGDN, arXiv:2610.41420)",
        "image.png": "",
    }
    for name, text in planted.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe 2026-12-02")
    found = provenance_lines(tmp_path, sorted(planted) + ["missing.md"])
    assert [line.split(":")[0] for line in found] == [
        "dated.py", "defaults.py", "design.md", "equation.py", "sparda.py", "sparsegdn.md", "tuning.md",
        "tuning_folder.md",
    ], found  # fmt: skip
    notes_only = provenance_lines(tmp_path, sorted(planted), STUDY_NOTES)
    assert [line.split(":")[0] for line in notes_only] == ["defaults.py", "equation.py", "sparda.py", "sparsegdn.md"]


def test_the_product_carries_no_dates_no_run_folders_and_no_design_notes():
    """src/, docs/, scripts/ and README.md say what and why; when and on which run belong in results JSON and git, and
    facts from the papers cite the papers, not the team's notes on them. The tests (but this file, which plants such
    lines) cite the papers too."""
    names = [name for name in tracked_sizes() if name.startswith(PRODUCT_TEXT)]
    assert names, "no tracked product files found"
    found = provenance_lines(ROOT, names)
    assert not found, "dates, tuning folders, DESIGN.md or study-notes references in the product:\n" + "\n".join(found)
    this_file = Path(__file__).resolve().relative_to(ROOT).as_posix()
    tests = [name for name in tracked_sizes() if name.startswith("tests/") and name != this_file]
    found = provenance_lines(ROOT, tests, STUDY_NOTES)
    assert not found, "study-notes references in the tests:\n" + "\n".join(found)


FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
SLUG_DROP = re.compile(r"[\u2000-\u206f\u2e00-\u2e7f\\'!\"#$%&()*+,./:;<=>?@\[\]^`{|}~’]")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return SLUG_DROP.sub("", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def relative_links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def markdown_files() -> list[Path]:
    return sorted(p for p in tracked_files() if p.suffix == ".md")


def test_slugs_follow_githubs_rule():
    assert slug("End to end: whole model vs transformers (`model`)") == "end-to-end-whole-model-vs-transformers-model"
    assert slug("SparseGDN prefill (`gdn_core`)") == "sparsegdn-prefill-gdn_core"
    assert slug("Open problems — in order") == "open-problems--in-order"


def test_every_relative_link_in_the_markdown_resolves():
    broken = []
    for doc in markdown_files():
        for target in relative_links(doc):
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            name = f"{doc.relative_to(ROOT).as_posix()}: {target}"
            if not dest.exists():
                broken.append(f"{name} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{name} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
