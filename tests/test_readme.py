"""The README stays one a newcomer can scan: what it is, then exactly two set-up commands (the
test one being what CI runs), then short paragraphs; reference material lives in docs/."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MAX_WORDS = 120
SET_UP_HEADING = "## Fresh machine: two commands"


def prose_units(text: str) -> list[str]:
    """The README's paragraphs and list items, outside fenced code blocks and tables."""
    units, current, fenced = [], [], False
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            fenced = not fenced
            line = ""
        if fenced:
            continue
        stripped = line.strip()
        starts_item = re.match(r"([-*]|\d+\.) ", stripped) is not None
        if not stripped or stripped.startswith(("|", "#")) or starts_item:
            if current:
                units.append(" ".join(current))
            current = [stripped] if starts_item else []
        else:
            current.append(stripped)
    return units


def sections(text: str) -> dict[str, str]:
    """Each `## ` heading's text (its subsections included)."""
    parts = re.split(r"^(## .*)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_paragraph_is_short():
    long = [f"{len(unit.split())} words: {unit[:60]}..." for unit in prose_units(README)
            if len(unit.split()) > MAX_WORDS]
    assert long == []


def test_the_set_up_section_comes_first_with_exactly_two_commands():
    assert next(iter(sections(README))) == SET_UP_HEADING
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", sections(README)[SET_UP_HEADING],
                        flags=re.MULTILINE | re.DOTALL)
    commands = [block.strip() for block in blocks]
    assert len(commands) == 2 and all("\n" not in command for command in commands)
    main_job, tests = commands
    assert main_job.startswith("pip install torch==2.13.0 . && tune run ")
    assert tests.startswith("pip install torch==2.13.0 -e ") and tests.endswith("pytest -q")


def test_ci_runs_the_readmes_test_command_verbatim():
    blocks = re.findall(r"^```\n(.*?)^```", sections(README)[SET_UP_HEADING],
                        flags=re.MULTILINE | re.DOTALL)
    assert blocks[1].strip() in (ROOT / ".ci/run").read_text().splitlines()


def test_the_documents_linked_exist():
    links = set(re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)\)", README))
    assert links and [link for link in links if not (ROOT / link).exists()] == []
