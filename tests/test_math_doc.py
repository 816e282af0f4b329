"""docs/MATH.md against the code that cites it: every "MATH.md section N" in the project names a section that
exists, the sections are numbered in order, and each says how it is tested with tests that exist.

Citation forms understood (whitespace, line breaks and comment markers between the words are allowed):
`MATH.md section 7`, `sections 2 and 3`, `sections 1-3, 5`, `section 9.4`, `sections 9.1-9.3`,
`section 1, "Title"` and `sections 1 "Title" and 4`. A quoted title must be a heading inside the cited section.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
MATH_DOC = ROOT / "docs" / "MATH.md"
SECTIONS = 12  # common numbering: 1-8 the paper's math, 9 today's baselines, 10 rollout correction, 11 custom, 12 cost
BASELINES = ("Dr. GRPO", "RLOO", "GSPO", "CISPO", "GMPO", "SAPO")  # 9.1 .. 9.6, in this order

# where citations live: the package, the maps, the other docs, tests, benchmarks, examples
SCANNED = ("rpg_cli", "tests", "docs", "benchmarks", "examples", "ARCHITECTURE.md", "README.md")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sbatch", ".txt", ".toml"}

_NUM = r"\d+(?:\.\d+)?"
_START = re.compile(r"MATH\.md,?\s+sections?\s+")
_REF = re.compile(rf"(?P<a>{_NUM})(?:\s*[-–]\s*(?P<b>{_NUM}))?(?:,?\s*[\"“](?P<title>[^\"”]+)[\"”])?")
_SEP = re.compile(r"(?:\s*,\s*(?:and\s+)?|\s+and\s+)(?:sections?\s+)?")
_HEADING = re.compile(r"^(?P<hashes>#{2,4})\s+(?:(?P<number>\d+(?:\.\d+)?)\.?\s+)?(?P<text>.*\S)\s*$")


class Citation(NamedTuple):
    section: str  # "7" or "9.4"
    title: str | None = None


class Heading(NamedTuple):
    level: int  # 2 for "##", 3 for "###"
    number: str | None
    text: str  # the whole heading after the hashes, number included
    line: int


# ---------------------------------------------------------------- the checker


def _flatten(text: str) -> str:
    """One line: a citation wrapped across docstring or comment lines reads as if it were not."""
    return re.sub(r"\s*\n\s*(?:#+\s*)?", " ", text)


def _expand(a: str, b: str | None) -> list[str] | None:
    """The sections a range names; None for a range that means nothing (9.1-10, 3-2)."""
    if b is None:
        return [a]
    if "." not in a and "." not in b and int(a) <= int(b):
        return [str(n) for n in range(int(a), int(b) + 1)]
    if "." in a and "." in b:
        (major_a, minor_a), (major_b, minor_b) = a.split("."), b.split(".")
        if major_a == major_b and int(minor_a) <= int(minor_b):
            return [f"{major_a}.{n}" for n in range(int(minor_a), int(minor_b) + 1)]
    return None


def citations(text: str) -> list[Citation | str]:
    """Every MATH.md section `text` cites, in order; a malformed range is its text (a problem to report)."""
    flat = _flatten(text)
    found: list[Citation | str] = []
    for start in _START.finditer(flat):
        pos = start.end()
        while (ref := _REF.match(flat, pos)) is not None:
            sections = _expand(ref["a"], ref["b"])
            if sections is None:
                found.append(ref.group(0))
            else:
                found.extend(Citation(s, ref["title"]) for s in sections)
            sep = _SEP.match(flat, ref.end())
            if sep is None or _REF.match(flat, sep.end()) is None:
                break
            pos = sep.end()
    return found


def headings(doc: str) -> list[Heading]:
    out = []
    for i, line in enumerate(doc.splitlines()):
        if m := _HEADING.match(line):
            out.append(Heading(len(m["hashes"]), m["number"], m["text"], i))
    return out


def _norm(text: str) -> str:
    return " ".join(text.replace("“", '"').replace("”", '"').split()).casefold()


def problem(citation: Citation | str, doc: str) -> str | None:
    """Why `citation` does not resolve in `doc` (the text of MATH.md), or None when it does."""
    if isinstance(citation, str):
        return f"malformed range {citation!r}"
    heads = headings(doc)
    level = 3 if "." in citation.section else 2
    index = next((i for i, h in enumerate(heads) if h.level == level and h.number == citation.section), None)
    if index is None:
        marker = "##" if level == 2 else "###"
        return f"no heading '{marker} {citation.section}{'.' if level == 2 else ''} ...'"
    if citation.title is None:
        return None
    span = [heads[index]]
    for h in heads[index + 1 :]:
        if h.level <= level:
            break
        span.append(h)
    if not any(_norm(citation.title) in _norm(h.text) for h in span):
        return f'no heading containing "{citation.title}" in section {citation.section}'
    return None


def prose(path: Path) -> list[str]:
    """The pieces of a file that can cite MATH.md: for Python its comment blocks and string literals, each on its
    own (so that a comment's citation never runs on into the code of the next line); otherwise the whole text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return python_prose(text) if path.suffix == ".py" else [text]


def python_prose(source: str) -> list[str]:
    pieces: list[str] = []
    comments: list[str] = []
    last_line = -2
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                if tok.start[0] != last_line + 1 and comments:
                    pieces.append("\n".join(comments))
                    comments = []
                comments.append(tok.string)
                last_line = tok.start[0]
            elif tok.type == tokenize.STRING:
                pieces.append(tok.string)
    except (tokenize.TokenError, SyntaxError):
        return [source]  # not Python after all: read it as text
    if comments:
        pieces.append("\n".join(comments))
    return pieces


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in SUFFIXES)
    this = Path(__file__).resolve()
    return [p for p in files if p.resolve() not in (this, MATH_DOC.resolve())]


def _all_citations() -> list[tuple[str, Citation | str]]:
    return [
        (str(path.relative_to(ROOT)), c) for path in scanned_files() for piece in prose(path) for c in citations(piece)
    ]


# ---------------------------------------------------------------- the checker on small strings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see MATH.md section 7.", [Citation("7")]),
        ("(MATH.md sections 2 and 3)", [Citation("2"), Citation("3")]),
        ("MATH.md sections 1-3, 5", [Citation("1"), Citation("2"), Citation("3"), Citation("5")]),
        ("MATH.md section 9.4", [Citation("9.4")]),
        ("MATH.md sections 9.1-9.3", [Citation("9.1"), Citation("9.2"), Citation("9.3")]),
        ('MATH.md section 1, "With a separate reference"', [Citation("1", "With a separate reference")]),
        ('MATH.md sections 1 "GRPO\'s KL term" and 4', [Citation("1", "GRPO's KL term"), Citation("4")]),
        ("MATH.md sections 1, 2 and 4, section 9.6", [Citation(s) for s in ("1", "2", "4", "9.6")]),
        ("# defaults (MATH.md\n    # section 8) here", [Citation("8")]),
        ('"""The loss (MATH.md\n    section 3, paper Algorithm 2)."""', [Citation("3")]),
        ("(MATH.md section 4, before beta)", [Citation("4")]),
        ("MATH.md section 1 table, section 2", [Citation("1")]),
        ("MATH.md's sections, cited in each docstring; MATH.md is the contract", []),
        ("MATH.md sections 3-2", ["3-2"]),
    ],
)
def test_the_checker_reads_every_citation_form(text, expected):
    assert citations(text) == expected


def test_a_comment_citation_does_not_run_on_into_the_next_line_of_code():
    source = 'OVERRIDES = {\n    "kl": "kl",  # k1, MATH.md section 4\n    "algorithm.kl_ctrl.type": "fixed",\n}\n'
    assert [c for piece in python_prose(source) for c in citations(piece)] == [Citation("4")]
    wrapped = "x = 1  # the loss (MATH.md\n# sections 2 and 3)\n"
    assert [c for piece in python_prose(wrapped) for c in citations(piece)] == [Citation("2"), Citation("3")]
    doc = 'def f():\n    """Dual clip (MATH.md section 1,\n    "With a separate reference")."""\n'
    assert [c for piece in python_prose(doc) for c in citations(piece)] == [Citation("1", "With a separate reference")]


SMALL_DOC = """# Title

## Notation

## 1. One
### 1.1 Sub one
text
## 2. Two
### 2.1 A quoted title here
## 10. Ten
"""


@pytest.mark.parametrize(
    "text",
    [
        "MATH.md section 1",
        "MATH.md section 1.1",
        "MATH.md sections 1 and 2",
        "MATH.md section 10",
        'MATH.md section 1, "Sub one"',
        'MATH.md section 2 "a QUOTED   title"',
        'MATH.md section 2.1 "quoted title"',
        'MATH.md section 1 "One"',
    ],
)
def test_the_checker_accepts_sections_that_exist(text):
    found = citations(text)
    assert found and [problem(c, SMALL_DOC) for c in found] == [None] * len(found)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("MATH.md section 3", "no heading '## 3. ...'"),
        ("MATH.md section 1.2", "no heading '### 1.2 ...'"),
        ("MATH.md sections 2-3", "no heading '## 3. ...'"),
        ('MATH.md section 1, "quoted title"', 'no heading containing "quoted title" in section 1'),
        ('MATH.md section 2.1 "Sub one"', 'no heading containing "Sub one" in section 2.1'),
        ("MATH.md section 11", "no heading '## 11. ...'"),  # "## 1." and "## 10." are not "## 11."
        ("MATH.md sections 9.3-9.1", "malformed range '9.3-9.1'"),
    ],
)
def test_the_checker_fails_for_a_section_that_does_not_exist(text, why):
    problems = [p for c in citations(text) if (p := problem(c, SMALL_DOC))]
    assert problems and problems[-1] == why


# ---------------------------------------------------------------- the project


def test_every_citation_in_the_project_resolves():
    doc = MATH_DOC.read_text(encoding="utf-8")
    found = _all_citations()
    assert len(found) >= 30, f"only {len(found)} citations found: is the parser still reading the code's form?"
    assert any(isinstance(c, Citation) and c.title for _, c in found)  # the quoted-title form is exercised
    broken = []
    for where, citation in found:
        if why := problem(citation, doc):
            cited = citation if isinstance(citation, str) else citation.section
            broken.append(f"{where}: MATH.md section {cited}: {why}")
    assert not broken, "\n".join(broken)


def test_sections_are_numbered_in_order_with_their_subsections():
    heads = headings(MATH_DOC.read_text(encoding="utf-8"))
    numbered = [h for h in heads if h.level == 2 and h.number is not None]
    assert [h.number for h in numbered] == [str(n) for n in range(1, SECTIONS + 1)]
    current, minor = None, 0
    for h in heads:
        if h.level == 2:
            current, minor = h.number, 0
        elif h.level == 3 and h.number is not None:
            major, sub = h.number.split(".")
            assert major == current, f"'### {h.number}' sits under section {current}"
            assert int(sub) == minor + 1, f"'### {h.number}' follows {current}.{minor}"
            minor = int(sub)


def test_section_9_holds_todays_baselines_in_order():
    heads = {h.number: h.text for h in headings(MATH_DOC.read_text(encoding="utf-8")) if h.level == 3}
    for i, name in enumerate(BASELINES, start=1):
        assert name in heads.get(f"9.{i}", ""), f"section 9.{i} should be {name}, is {heads.get(f'9.{i}')!r}"


def _sections(doc: str) -> dict[str, str]:
    """Body of each numbered '## N.' section."""
    parts = re.split(r"^## (?=\d+\. )", doc, flags=re.M)
    return {p.split(".", 1)[0]: p for p in parts[1:]}


def test_every_section_says_how_it_is_tested():
    sections = _sections(MATH_DOC.read_text(encoding="utf-8"))
    missing = [n for n, body in sections.items() if "Tested by:" not in body]
    assert not missing, f"sections without a 'Tested by:' line: {missing}"


def test_the_tests_named_in_the_doc_exist():
    doc = MATH_DOC.read_text(encoding="utf-8")
    files = sorted(set(re.findall(r"tests/(test_\w+\.py)", doc)))
    assert files, "the doc names no test file"
    absent = [f for f in files if not (ROOT / "tests" / f).is_file()]
    assert not absent, f"MATH.md names test files that do not exist: {absent}"
    defined = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        defined.update(re.findall(r"^\s*def (test_\w+)", path.read_text(encoding="utf-8"), flags=re.M))
    named = set(re.findall(r"`(test_\w+)`", doc))
    assert not named - defined, f"MATH.md names test functions that do not exist: {sorted(named - defined)}"
