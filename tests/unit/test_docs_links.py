"""The documentation holds together: README.md links every page of docs/, no relative Markdown link in README.md or
docs/*.md leads to a missing file, and each top-level script's opening comment points at docs/commands.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("deploy.py", "status.py", "logs.py", "stop.py", "restart.py", "rollback.py", "link_check.py")
COMMANDS_PAGE = "docs/commands.md"

_FENCED = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*<?([^\s>]+)>?", re.M)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def link_targets(markdown: str) -> list[str]:
    """Every link target of a Markdown text (inline, image and reference links), code blocks and spans left out:
    `[x](y)` in code is an example, not a link."""
    text = _CODE_SPAN.sub("", _FENCED.sub("", markdown))
    return _INLINE.findall(text) + _REFERENCE.findall(text)


def local_file(target: str) -> str | None:
    """The file a relative link names; None for a URL or an anchor on the same page."""
    if _SCHEME.match(target) or target.startswith("#"):
        return None
    return unquote(target.split("#", 1)[0].split("?", 1)[0])


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def broken_links(root: Path) -> list[str]:
    """'page: target' for each relative link whose file does not exist (a leading / is the repository's root)."""
    broken = []
    for page in pages(root):
        for target in link_targets(page.read_text(encoding="utf-8")):
            path = local_file(target)
            if path is None:
                continue
            where = root / path.lstrip("/") if path.startswith("/") else page.parent / path
            if not where.exists():
                broken.append(f"{page.relative_to(root)}: {target}")
    return broken


def unlinked_docs(root: Path) -> list[str]:
    """The pages of docs/ that README.md has no link to."""
    readme = root / "README.md"
    linked = {(root / path).resolve() for target in link_targets(readme.read_text(encoding="utf-8"))
              if (path := local_file(target))}
    return [f"docs/{page.name}" for page in sorted((root / "docs").glob("*.md")) if page.resolve() not in linked]


def header(source: str) -> str:
    """A script's opening comment lines and its module docstring, if any."""
    comments = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        comments.append(line)
    return "\n".join(comments) + "\n" + (ast.get_docstring(ast.parse(source)) or "")


def scripts_without_commands_page(root: Path) -> list[str]:
    return [name for name in SCRIPTS if COMMANDS_PAGE not in header((root / name).read_text(encoding="utf-8"))]


# --- this repository ----------------------------------------------------------------------------------------------

def test_readme_links_every_page_of_docs():
    assert unlinked_docs(ROOT) == [], "add a Markdown link to each page in README.md (its table 'More to read')"


def test_no_relative_link_in_readme_or_docs_leads_to_a_missing_file():
    assert broken_links(ROOT) == []


def test_each_script_header_points_at_the_commands_page():
    assert scripts_without_commands_page(ROOT) == [], f"add 'See {COMMANDS_PAGE}' to the script's opening comment"


# --- the checks themselves, on a small tree -----------------------------------------------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_the_checks_find_an_unlinked_page_and_links_to_missing_files(tmp_path):
    root = _tree(tmp_path, {
        "README.md": ("See [a](docs/a.md#part), [gone](docs/gone.md), [site](https://example.org/x.md),\n"
                      "`[in code](docs/b.md)` and [top](#quick-start).\n\n```\n[fenced](docs/b.md)\n```\n"),
        "docs/a.md": "[back](../README.md) [no](missing.md#x) ![pic](img/none.png)\n\n[ref]: ./c.md\n",
        "docs/b.md": "nothing links here from README.md\n",
    })
    assert unlinked_docs(root) == ["docs/b.md"]
    assert broken_links(root) == ["README.md: docs/gone.md", "docs/a.md: missing.md#x", "docs/a.md: img/none.png",
                                  "docs/a.md: ./c.md"]


def test_the_header_check_reads_only_the_opening_comment_or_docstring(tmp_path):
    root = _tree(tmp_path, {
        "deploy.py": "# Converge both Sparks.\n# See docs/commands.md for its flags.\nimport os\n",
        "status.py": '"""Both Sparks in one table. See docs/commands.md."""\nimport os\n',
        "logs.py": "# Each rank's log.\nimport os\n# see docs/commands.md (too late: not the header)\n",
        "stop.py": "# Stop both ranks.\n\n# See docs/commands.md (after a blank line: not the header)\n",
        "restart.py": "import os  # See docs/commands.md\n",
        "rollback.py": "#!/usr/bin/env python3\n# See docs/commands.md\n",
        "link_check.py": "# Measure the link now.\n# See docs/commands.md\n",
    })
    assert scripts_without_commands_page(root) == ["logs.py", "stop.py", "restart.py"]
