"""The repository holds the product and its current evidence: no large or dated files, and every relative link in
its Markdown resolves (the file, and the heading when the link names one)."""

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
