"""Whether an artifact the head writes is already whole, each decided by one shell test: the fact runs it on the
Spark (the operation that writes the artifact reads its verdict), and a background stream runs the same test before
it writes (operations/data/background.py), so a run and a stream never disagree on what is left to do."""

from __future__ import annotations

from shlex import quote

from pyinfra.api import FactBase

from operations.layout import TOKEN_MAP_FILE

SOURCE = ".sparkfold-source"  # the sidecar naming what a folder's files were made from (a commit, a pack)


def _verdict(test: str) -> str:
    return f"if {test}; then echo whole; else echo not-whole; fi"


class RankFileWhole(FactBase[bool]):
    """Whether `folder` holds one whole weight file of `rank`, made from `source`."""

    default = bool

    @staticmethod
    def test(folder: str, rank: int, source: str) -> str:
        """The shell test: the sidecar names `source`, exactly one rank<R>of2-<hash>.bin, no .rank<R>of2.partial
        (what an interrupted write leaves)."""
        f = quote(folder)
        return (f"[ \"$(cat {f}/{SOURCE} 2>/dev/null)\" = {quote(source)} ] && "
                f"[ \"$(ls -A {f} 2>/dev/null | grep -c -E '^rank{int(rank)}of2-[0-9a-f]+[.]bin$')\" = 1 ] && "
                f"[ ! -e {f}/.rank{int(rank)}of2.partial ]")

    def command(self, folder: str, rank: int, source: str) -> str:
        return _verdict(self.test(folder, rank, source))

    def process(self, output: list[str]) -> bool:
        return "whole" in output


class TokenMapWhole(FactBase[bool]):
    """Whether `out_dir` holds the token map of `commit`."""

    default = bool

    @staticmethod
    def test(out_dir: str, commit: str) -> str:
        """The shell test: the map is a file and its sidecar's first line names `commit` (the sidecar is written
        last, so a map without it was interrupted)."""
        path = quote(f"{out_dir}/{TOKEN_MAP_FILE}")
        return (f"[ \"$(head -n 1 {quote(f'{out_dir}/{TOKEN_MAP_FILE}.commit')} 2>/dev/null)\" = {quote(commit)} ] "
                f"&& [ -f {path} ]")

    def command(self, out_dir: str, commit: str) -> str:
        return _verdict(self.test(out_dir, commit))

    def process(self, output: list[str]) -> bool:
        return "whole" in output
