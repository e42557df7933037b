"""Whether the API key file exists, with its mode and owner: stat only, the key is never read."""

from __future__ import annotations

from pyinfra.api import FactBase

from operations.util import sh


class ApiKeyFile(FactBase):
    """{"present": bool (exists and not empty), "empty": bool, "mode": "600" | None, "owner": str | None}."""

    def command(self, path):
        p = sh(path)
        return (f"if [ -s {p} ]; then echo \"key $(stat -c '%a %U' {p})\"; "
                f"elif [ -e {p} ]; then echo \"empty $(stat -c '%a %U' {p})\"; else echo missing; fi")

    @staticmethod
    def default():
        return {"present": False, "empty": False, "mode": None, "owner": None}

    def process(self, output):
        words = " ".join(output).split()
        found = self.default()
        if words and words[0] in ("key", "empty") and len(words) >= 3:
            found.update(present=words[0] == "key", empty=words[0] == "empty", mode=words[1], owner=words[2])
        return found
