"""How open rank 0's API is: whether it wants a key and which address it listens on, read from an argv (a running
container's or a generation record's) or from the settings, and how a pair that serves is more open than the settings
ask. A rollback restarts a recorded pair exactly as it ran, so it can bring back a keyless or wider API the settings
have since closed: this says so in words. Pure: no pyinfra.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LOOPBACK = ("127.0.0.1", "::1", "localhost")
WILDCARD = ("0.0.0.0", "::", "[::]", "*")


@dataclass(frozen=True)
class Exposure:
    keyed: bool  # rank 0 asks for the API key
    host: str  # the address it listens on


def _reach(host: str) -> int:
    """How widely an address is reached: loopback 0, one address 1, every address 2."""
    if host in LOOPBACK:
        return 0
    return 2 if host in WILDCARD or not host else 1


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in a command line, given as `--flag value` or `--flag=value`; None when absent."""
    for i, word in enumerate(argv):
        name, has_value, value = word.partition("=")
        if name == flag:
            return value if has_value else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def of_argv(argv: Sequence[str]) -> Exposure:
    """What rank 0's argv serves (no --host: the engine's default, every address)."""
    flags = {word.partition("=")[0] for word in argv}
    return Exposure(keyed=bool(flags & {"--api-key-file", "--api-key"}), host=flag_value(argv, "--host") or "0.0.0.0")


def of_settings(s) -> Exposure:
    return Exposure(keyed=bool(s.api_key), host=s.host)


def more_open(serving: Exposure, asked: Exposure) -> list[str]:
    """How `serving` is more open than `asked`, in words ([] when it is not)."""
    found = []
    if asked.keyed and not serving.keyed:
        found.append("the API answers without a key, while the settings ask for one (api_key = true)")
    if _reach(serving.host) > _reach(asked.host):
        found.append(f"it listens on {serving.host}, while the settings ask for {asked.host} (host)")
    return found


def open_note(serving: Exposure, port: int) -> str:
    """The LIVE line's warning for an API anyone who reaches the Spark can use ("" when keyed or loopback-only)."""
    if serving.keyed or serving.host in LOOPBACK:
        return ""
    return (f"the API has no key and listens on {serving.host}:{port}: anyone who reaches this Spark on that port can "
            "use it. Fix: SPARKFOLD_API_KEY=1 (or api_key = true in group_data/all.py); docs/security.md")


CLOSE_IT = ("To close it now: stop.py stops both ranks; or fix the cause and run deploy.py again, which starts the "
            "pair the settings ask for")


def rollback_warning(serving: Exposure, asked: Exposure) -> str:
    """What an automatic rollback says when the pair it brought back is more open than the settings ask."""
    found = more_open(serving, asked)
    if not found:
        return ""
    return (f"the generation that serves again was recorded before the settings changed: {'; and '.join(found)}. "
            f"{CLOSE_IT}.")
