"""The documentation stays a user's: short README, links that resolve, reference pages that
match the code, and no internal tracker numbers or work-log language in README, docs/ or
rlgraph/."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").rglob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *DOCS]
CODE = sorted((ROOT / "rlgraph").rglob("*.py"))

# "<project> issue N" cites another project's tracker; a bare "issue N" is ours.
CITED = {"verl", "sglang", "vllm", "areal", "ray", "torch", "pytorch", "transformers",
         "megatron", "trl", "awesome-ml-sys-tutorial", "nccl", "flashinfer"}
WORK_LOG = [r"\bround \d+\b", r"\bround \"\w+\"", r"\bsession \d+\b", r"\bthe lead\b",
            r"\breview(?:er|ers|ed)?\b", r"\bthis branch\b"]
WORK_LOG_PROSE = [r"\b(?:second|third|fourth|fifth|sixth|seventh|eighth) round\b",
                  r"\bhelpers?\b", r"\bmain's\b", r"\bof main\b"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def internal_references(text: str, prose: bool) -> list[str]:
    """Internal issue numbers and work-log phrases in `text`."""
    found = []
    for match in re.finditer(r"(?:([\w.-]+)\s+)?\b[Ii]ssues? #?\d+", text):
        if (match.group(1) or "").lower().rstrip("'s") not in CITED:
            found.append(re.search(r"[Ii]ssues? #?\d+", match.group(0)).group(0))
    for pattern in WORK_LOG + (WORK_LOG_PROSE if prose else []):
        found += [m.group(0) for m in re.finditer(pattern, text, re.I)]
    return found


@pytest.mark.parametrize("path", PAGES + CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_references(path: Path) -> None:
    found = internal_references(path.read_text(), prose=path.suffix == ".md")
    assert not found, f"{path.relative_to(ROOT)}: {found[:5]}"


def test_detector_catches_what_it_should() -> None:
    assert internal_references("fixed in issue 14 (round \"areal\")", prose=True) == [
        "issue 14", 'round "areal"']
    assert internal_references("verl issue 2419 and sglang PR 2904", prose=True) == []
    assert internal_references("the fifth round of review", prose=True)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_reference_pages_are_up_to_date() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_docs
    finally:
        sys.path.pop(0)
    assert gen_docs.stale_pages() == [], "run: python tools/gen_docs.py"
