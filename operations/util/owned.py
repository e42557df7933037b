"""Files sparkfold owns carry its header. A path that already holds a file without it belongs to someone else: it is
refused, never overwritten (a setting that points at /etc/netplan/50-cloud-init.yaml must not replace it)."""

from __future__ import annotations

from operations.util.commands import MANAGED_HEADER


def foreign_file_problem(path: str, text: str | None) -> str | None:
    """None when `path` is absent or sparkfold's; else the refusal naming the file and the fix."""
    if text is None or text.startswith(MANAGED_HEADER) or MANAGED_HEADER in text.splitlines()[:3]:
        return None
    return (f"{path} exists and was not written by sparkfold (no '{MANAGED_HEADER.split(':')[0]}' line), so it is "
            "left alone: move it away yourself if sparkfold should own that path, or point the setting at another "
            "file")
