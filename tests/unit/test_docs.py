"""The manual (README.md and docs/*.md) reads as a reference: no scratch paths, tracker numbers or commit
hashes, every relative link lands on a file and heading that exist, and docs/README.md lists every page.

The lab notebook, docs/experiments/, keeps the commits of its day, which reproduce its records, but no
scratch path or tracker number either: its commands name their lake with GEM_HOME.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
READING_ORDER = DOCS / "README.md"
MANUAL = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
NOTEBOOK = sorted((DOCS / "experiments").glob("*.md"))

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)

# A scratch path a reader's machine does not have.
TMP_PATH = re.compile(r"(?<![\w$/])/tmp\b")
# "issue 16", "issues 14 and 15", "PR 7", "#37"; not an anchor, an HTML entity or an upstream "owner/repo#N".
TRACKER = re.compile(r"\b(?:[Ii]ssues?|PRs?|[Pp]ull requests?)\s+#?\d+|(?<![\w/&])#\d+\b")
# A commit hash: 7-40 hex digits with a digit and a letter, standing alone (not inside a hyphenated name such
# as a model version, a dotted name, a path or a longer word).
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _without_code(text: str) -> str:
    """The text a reader sees as prose and links: fenced blocks and code spans blanked out."""
    return CODE_SPAN.sub("``", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading).lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(_without_code(page.read_text(encoding="utf-8")))
        if not re.match(r"[a-z][a-z+.-]*:", target)
    ]  # http:, https:, mailto: are not files


def _hits(pattern: re.Pattern[str], page: Path) -> list[str]:
    return [
        f"{_rel(page)}:{number}: {match.group(0)!r} in {line.strip()[:120]!r}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for match in pattern.finditer(line)
    ]


@pytest.mark.parametrize("page", MANUAL, ids=_rel)
@pytest.mark.parametrize(
    ("what", "pattern"),
    [("a /tmp path", TMP_PATH), ("a tracker number", TRACKER), ("a commit hash", COMMIT)],
    ids=["tmp", "tracker", "commit"],
)
def test_the_manual_names_no_scratch_path_tracker_number_or_commit(page, what, pattern):
    hits = _hits(pattern, page)
    assert not hits, (
        f"{what} in the manual means nothing to a reader of the repository; say what the thing "
        f"does, and move the history to docs/experiments/:\n" + "\n".join(hits)
    )


@pytest.mark.parametrize("page", NOTEBOOK, ids=_rel)
@pytest.mark.parametrize(
    ("what", "pattern"), [("a /tmp path", TMP_PATH), ("a tracker number", TRACKER)], ids=["tmp", "tracker"]
)
def test_the_notebook_names_no_scratch_path_or_tracker_number(page, what, pattern):
    hits = _hits(pattern, page)
    assert not hits, (
        f"{what} means nothing to a reader of the repository: name the lake with GEM_HOME and the work by what "
        "it did:\n" + "\n".join(hits)
    )


@pytest.mark.parametrize("page", MANUAL + NOTEBOOK, ids=_rel)
def test_every_relative_link_lands_on_a_file_and_heading_that_exist(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading of {_rel(dest)} has the anchor #{anchor}")
    assert not broken, f"{_rel(page)} links to what does not exist:\n" + "\n".join(broken)


def test_the_reading_order_lists_every_page_of_the_manual_and_the_notebook():
    listed = {(READING_ORDER.parent / target.partition("#")[0]).resolve() for target in _links(READING_ORDER)}
    pages = {page.resolve() for page in MANUAL if page != READING_ORDER} | {(DOCS / "experiments" / "README.md")}
    missing = sorted(_rel(page) for page in pages - listed)
    assert not missing, f"docs/README.md's reading order does not link {missing}: add each where it is read"


def test_the_notebook_index_lists_every_record():
    index = DOCS / "experiments" / "README.md"
    listed = {(index.parent / target.partition("#")[0]).resolve() for target in _links(index)}
    missing = sorted(_rel(page) for page in NOTEBOOK if page != index and page.resolve() not in listed)
    assert not missing, f"docs/experiments/README.md does not list {missing}"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("GEM_HOME=/tmp/m16/small python bench/x.py", TMP_PATH),
        ("the world of issue 16", TRACKER),
        ("fixed in #37", TRACKER),
        ("the default since aa08873", COMMIT),
        ("on the hashed lake (7731b18)", COMMIT),
        ("commit `1f36148`", COMMIT),
    ],
)
def test_each_pattern_catches_what_it_is_for(text, pattern):
    assert pattern.search(text)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("spills to `$TMPDIR/gem-sql-<uid>/`", TMP_PATH),
        ("see [locks](#locks) and upstream triton-lang/triton#11584", TRACKER),
        ("the teacher bench-small-synthetic-gem-ca1199006a, 100000000 rows, sha256 " + "ab12" * 16, COMMIT),
    ],
)
def test_each_pattern_leaves_alone_what_is_not_history(text, pattern):
    assert not pattern.search(text)
