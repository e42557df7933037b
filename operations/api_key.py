"""The API key (s.api_key): a random key made once on the head in <state_dir>/api-key.d/key (0600, the ssh user's).

It is generated on the head (`secrets.token_hex(32)` in the head's python3, written under umask 077), so it never
passes through this machine's command lines or logs; facts only stat the file. A new key (first one or rotation,
`--data rotate_api_key=true`) is written to a temp file and renamed over the old one: the engine, which re-reads
the file when its mtime changes and closes authenticated routes on an empty or partial file, never sees half a
key. Rank 0 mounts the folder, not the file, so the rename reaches it; docs/api-key.md has the details."""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import StringCommand, deploy, operation

from operations.facts.files import ApiKeyFile
from operations.owned.folders import PRIVATE, owned_folders
from operations.rank.serving import open_api_note
from operations.settings import Settings
from operations.util import sh, warned

KEY_FILE = "api-key"
# prints a new key; run on the head only
_NEW_KEY = "python3 -c 'import secrets; print(secrets.token_hex(32))'"


def api_key_path(s) -> str:
    return s.layout.api_key


def live_hint(s) -> str:
    """What the LIVE line says about the key: where it is, never the key."""
    if not s.api_key:
        return "API open (no key)"
    return f"API key in {api_key_path(s)} on the head (mode 0600; send it as Authorization: Bearer)"


def _generate(path: str, rotate: bool) -> StringCommand:
    key_file, tmp = sh(path), sh(path + ".new")
    directory = sh(posixpath.dirname(path))
    # the whole key into a temp file beside it, then one rename: atomic for every reader, the engine included
    write = f"{_NEW_KEY} > {tmp} && [ -s {tmp} ] && mv -f {tmp} {key_file}"
    guard = "" if rotate else f"[ -s {key_file} ] || "
    return StringCommand(f"umask 077 && mkdir -p {directory} && {{ {guard}{{ {write}; }}; }}")


def _adopt(legacy: str, path: str) -> StringCommand:
    """The key of an older layout moved into the mounted folder (mv -n: never over a key already there)."""
    return StringCommand(f"umask 077 && mkdir -p {sh(posixpath.dirname(path))} && mv -n {sh(legacy)} {sh(path)}")


@operation()
def api_key_present(path: str, owner: str, rotate: bool = False, legacy: str = ""):
    """A non-empty key file at `path`, mode 600, owned by `owner`; a new key only when missing, empty, or rotating.

    + path: absolute path of the key file on the head
    + owner: the user that owns it (the ssh user)
    + rotate: replace the key with a new one
    + legacy: where an older sparkfold kept the key; moved to `path` when only it exists
    """
    have = host.get_fact(ApiKeyFile, path=path)
    old = host.get_fact(ApiKeyFile, path=legacy) if legacy and not have["present"] else ApiKeyFile.default()
    if old["present"]:
        yield _adopt(legacy, path)  # the key clients already hold stays valid
        have = old
    elif have["present"] and not rotate and have["mode"] == "600" and have["owner"] == owner:
        host.noop(f"API key file {path} is present (600, {owner})")
        return
    if have["owner"] is not None and have["owner"] != owner:
        # someone else's file (made by root?): only root can give it back
        yield StringCommand("chown", sh(owner), sh(path), _sudo=True)
    if have["mode"] is not None and have["mode"] != "600":
        yield StringCommand("chmod", "600", sh(path))
    if rotate or not have["present"]:
        yield _generate(path, rotate)  # by the ssh user under umask 077: its own file, mode 600


@deploy("The API key")
def api_key(s: Settings) -> None:
    """Head, with api_key on: a random key in a 0600 file (rotated on request)."""
    note = open_api_note(s) if s.is_head else ""
    if note:
        warned("API key", note)  # by --dry and every run, before any change
    if not (s.api_key and s.is_head):
        return
    rotate = s.rotate_api_key
    # the folder rank 0 mounts: the ssh user's, 0700 (a key write into a folder chmod'ed 644 fails)
    owned_folders(name=f"{s.layout.api_key_dir}: {s.ssh_user}'s, mode {PRIVATE} (head only)",
                  folders=((s.layout.api_key_dir, PRIVATE),), owner=s.ssh_user)
    api_key_present(
        name=("API key rotated" if rotate else "API key present") + f" in {api_key_path(s)} (head only)",
        path=api_key_path(s),
        owner=s.ssh_user,
        rotate=rotate,
        legacy=s.layout.legacy_api_key,
    )
