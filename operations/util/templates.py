"""The one Jinja environment for templates/: every file sparkfold owns is rendered here, header first."""

from __future__ import annotations

from pathlib import Path

import jinja2

from operations.util.commands import MANAGED_HEADER

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)), trim_blocks=True, lstrip_blocks=True,
    keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
)


def render(name: str, **data: object) -> str:
    """templates/<name> rendered with `data` and `header` (the "Managed by sparkfold" line)."""
    return _ENV.get_template(name).render(header=MANAGED_HEADER, **data)
