"""Every example on README and the documentation pages runs, so an example that drifts from the code fails.

A page's fenced blocks run in order, each in a fresh process, in one temporary folder per page (a
block may use the files an earlier block of its page wrote):

- ```` ```python ```` blocks run, unless the line before the fence is ``<!-- not run: REASON -->``;
  a block that starts with ``>>>`` is a session: its prompt lines run and what they print must be
  the lines shown between them;
- ```` ```bash ```` blocks run when the line before the fence is ``<!-- run -->`` (the others install
  packages, start several processes or need a GPU); ``blueprint`` in them is this tree's CLI.

The processes see this repository first on their path (PYTHONPATH), so the pages are checked against
this tree's code whatever else is installed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "_ext" not in p.parts)
BLOCK_TIMEOUT_S = 600     # a hung example fails its test instead of the run
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
MARKER = re.compile(r"<!-- (run|not run: (.+?)) -->\s*$")
CLI = "blueprint() { python -m blueprint \"$@\"; }\n"     # this tree's CLI, not an installed one


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    language: str
    source: str
    marker: str          # "", "run" or "not run: REASON"

    @property
    def runs(self) -> bool:
        if self.language == "python":
            return not self.marker.startswith("not run")
        return self.language == "bash" and self.marker == "run"


def examples(page: Path) -> list[Example]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(Example(str(page.relative_to(ROOT)), text.count("\n", 0, match.start()) + 1, match.group(1),
                             match.group(2), marker.group(1) if marker else ""))
    return found


def session(source: str) -> tuple[str, str]:
    """A `>>>` session as (the code it runs, what it must print)."""
    code, shown = [], []
    for line in source.splitlines():
        if line.startswith((">>> ", "... ")) or line in (">>>", "..."):
            code.append(line[4:])
        else:
            shown.append(line)
    return "\n".join(code) + "\n", "\n".join(shown).strip("\n")


def run(example: Example, folder: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    where = f"{example.page}:{example.line}"
    if example.language == "bash":
        command, shown = ["bash", "-euo", "pipefail", "-c", CLI + example.source], None
    elif example.source.startswith(">>>"):
        code, shown = session(example.source)
        command = [sys.executable, "-c", code]
    else:
        command, shown = [sys.executable, "-c", example.source], None
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, f"the example at {where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    if shown is not None:
        assert done.stdout.strip("\n") == shown, f"the example at {where} prints something else:\n{done.stdout}"


def pages_with_examples() -> list[Path]:
    return [page for page in PAGES if any(example.runs for example in examples(page))]


@pytest.mark.parametrize("page", pages_with_examples(), ids=lambda page: str(page.relative_to(ROOT)))
def test_the_examples_of_a_page_run(page, tmp_path):
    for example in examples(page):
        if example.runs:
            run(example, tmp_path)


def test_every_example_that_does_not_run_says_why():
    silent = [f"{e.page}:{e.line}" for page in PAGES for e in examples(page)
              if e.language == "python" and e.marker.startswith("not run") and not e.marker[len("not run:"):].strip()]
    assert not silent, f"examples marked 'not run' without a reason: {silent}"
    misplaced = [f"{e.page}:{e.line}" for page in PAGES for e in examples(page) if e.marker == "run" and e.language != "bash"]
    assert not misplaced, f"<!-- run --> marks bash blocks only (python blocks always run): {misplaced}"


def test_the_runner_finds_the_examples():
    """The parser must see the pages' blocks: a regex that matched nothing would pass every page."""
    everything = [e for page in PAGES for e in examples(page)]
    running = [e for e in everything if e.runs]
    assert sum(e.language == "python" for e in running) >= 10
    assert any(e.language == "bash" for e in running)
    assert any(e.source.startswith(">>>") for e in running)


def test_a_session_compares_what_it_prints():
    code, shown = session(">>> x = 2\n>>> print(x + 1)\n3\n")
    assert (code, shown) == ("x = 2\nprint(x + 1)\n", "3")
