"""The API key (s.api_key): a random key made once on the head in <state_dir>/api-key.d/key (0600, the ssh user's),
or the user's own key (api_key_file, a file on this machine) written there.

A generated key is made on the head (`secrets.token_hex(32)` in the head's python3, under umask 077), so it never
passes through this machine's command lines or logs; facts only stat the file. A new key (first one or rotation,
`--data rotate_api_key=true`) is written to a temp file and renamed over the old one: the engine, which re-reads
the file when its mtime changes and closes authenticated routes on an empty or partial file, never sees half a
key. Rank 0 mounts the folder, not the file, so the rename reaches it; docs/api-key.md has the details.
An own key is uploaded over SFTP into key.new (0600 before it lands) and renamed the same way; a fact compares the
file's sha256 with the key's, so a head that holds it changes nothing and the key is never on a command line."""

from __future__ import annotations

import hashlib
import posixpath
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, deploy, operation

from operations.facts.files import ApiKeyFile, ApiKeyFileSum
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


def key_text(key: str) -> str:
    """The key file's content for a key: the key on one line, as a generated key is written."""
    return key + "\n"


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


def _fix_mode_and_owner(path: str, owner: str, have) -> list[StringCommand]:
    commands = []
    if have["owner"] is not None and have["owner"] != owner:
        # someone else's file (made by root?): only root can give it back
        commands.append(StringCommand("chown", sh(owner), sh(path), _sudo=True))
    if have["mode"] is not None and have["mode"] != "600":
        commands.append(StringCommand("chmod", "600", sh(path)))
    return commands


def _own_key(path: str, owner: str, key: str):
    """The file holds exactly `key`: uploaded into key.new (0600 first) and renamed over the file unless its sha256
    already is the key's."""
    have = host.get_fact(ApiKeyFileSum, path=path)
    if have["sha256"] == hashlib.sha256(key_text(key).encode()).hexdigest():
        if fixes := _fix_mode_and_owner(path, owner, have):
            yield from fixes
        else:
            host.noop(f"API key file {path} holds your key (600, {owner})")
        return
    new = path + ".new"
    yield StringCommand(f"umask 077 && mkdir -p {sh(posixpath.dirname(path))} && install -m 600 /dev/null {sh(new)}")
    yield FileUploadCommand(StringIO(key_text(key)), new)
    yield StringCommand(f"mv -f {sh(new)} {sh(path)}")  # one rename: readers see the old key or the new one


@operation()
def api_key_present(path: str, owner: str, rotate: bool = False, legacy: str = "", key: str = ""):
    """A non-empty key file at `path`, mode 600, owned by `owner`: `key` when given, else a random key made on the
    head, new only when missing, empty, or rotating.

    + path: absolute path of the key file on the head
    + owner: the user that owns it (the ssh user)
    + rotate: replace a generated key with a new one
    + legacy: where an older sparkfold kept the key; moved to `path` when only it exists
    + key: the user's own key (api_key_file); never printed
    """
    if key:
        yield from _own_key(path, owner, key)
        return
    have = host.get_fact(ApiKeyFile, path=path)
    old = host.get_fact(ApiKeyFile, path=legacy) if legacy and not have["present"] else ApiKeyFile.default()
    if old["present"]:
        yield _adopt(legacy, path)  # the key clients already hold stays valid
        have = old
    elif have["present"] and not rotate and have["mode"] == "600" and have["owner"] == owner:
        host.noop(f"API key file {path} is present (600, {owner})")
        return
    yield from _fix_mode_and_owner(path, owner, have)
    if rotate or not have["present"]:
        yield _generate(path, rotate)  # by the ssh user under umask 077: its own file, mode 600


@deploy("The API key")
def api_key(s: Settings) -> None:
    """Head, with api_key on: the user's key (api_key_file) or a random one in a 0600 file (rotated on request)."""
    note = open_api_note(s) if s.is_head else ""
    if note:
        warned("API key", note)  # by --dry and every run, before any change
    if not (s.api_key and s.is_head):
        return
    rotate = s.rotate_api_key
    # the folder rank 0 mounts: the ssh user's, 0700 (a key write into a folder chmod'ed 644 fails)
    owned_folders(name=f"{s.layout.api_key_dir}: {s.ssh_user}'s, mode {PRIVATE} (head only)",
                  folders=((s.layout.api_key_dir, PRIVATE),), owner=s.ssh_user)
    if s.api_key_file:
        what = "API key from api_key_file"
    else:
        what = "API key rotated" if rotate else "API key present"
    api_key_present(
        name=f"{what} in {api_key_path(s)} (head only)",
        path=api_key_path(s),
        owner=s.ssh_user,
        rotate=rotate,
        legacy=s.layout.legacy_api_key,
        key=s.own_api_key,
    )
