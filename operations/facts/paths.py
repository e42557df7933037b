"""Where a path really leads (links resolved)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class RealPath(FactBase):
    """`readlink -f` of a path whose every link resolves, or None (the path or a link target is missing)."""

    @staticmethod
    def default():
        return None

    def command(self, path):
        return f"readlink -e {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return output[0].strip() or None if output else None
