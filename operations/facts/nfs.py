"""Facts for the NFS share: the head's export file, live export table, nfs-server package and service; the
worker's docker volume and the containers using it. Every command exits 0."""

from __future__ import annotations

import base64
import binascii
import json

from pyinfra.api import FactBase, QuoteString, StringCommand


class FileContent(FactBase):
    """A small text file's exact content, or None when it does not exist."""

    default = lambda self: None  # noqa: E731

    def command(self, path):
        p = QuoteString(path)
        return StringCommand("if [ -f", p, "]; then printf 'present '; base64 -w0", p,
                             "2>/dev/null; echo; else echo absent; fi")

    def process(self, output):
        line = output[0] if output else "absent"
        if not line.startswith("present"):
            return None
        try:
            return base64.b64decode(line[len("present"):].strip()).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            return ""


def _unescape(path: str) -> str:
    # exportfs prints unusual characters in paths as octal escapes (a space is \040)
    out, i = "", 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1:i + 4].isdigit() and len(path[i + 1:i + 4]) == 3:
            out += chr(int(path[i + 1:i + 4], 8))
            i += 4
        else:
            out += path[i]
            i += 1
    return out


class ExportTable(FactBase):
    """The live export table from `exportfs -v`: [{"path", "client", "options": [..]}].

    exportfs prints `<path>\\t<client>(<opts>)`, or the path alone with the client on the next line
    (indented) when the path is long.
    """

    default = list

    def command(self):
        return "exportfs -v 2>/dev/null || true"

    def process(self, output):
        table, path = [], None
        for line in output:
            if not line.strip():
                continue
            if not line[0].isspace():
                words = line.split(None, 1)
                path = _unescape(words[0])
                rest = words[1] if len(words) > 1 else ""
            else:
                rest = line
            rest = rest.strip()
            if path is None or not rest:
                continue
            client, _, opts = rest.partition("(")
            table.append({"path": path, "client": client.strip(),
                          "options": [o for o in opts.rstrip(")").split(",") if o]})
        return table


class DebInstalled(FactBase):
    """True when a Debian package is installed (dpkg's status says "install ok installed")."""

    default = lambda self: False  # noqa: E731

    def command(self, package):
        return StringCommand("dpkg-query -W -f='${Status}\\n'", QuoteString(package), "2>/dev/null || true")

    def process(self, output):
        return any(line.strip() == "install ok installed" for line in output)


class ServiceState(FactBase):
    """{"active": str, "enabled": str} from `systemctl is-active` / `is-enabled` ("" when unknown)."""

    default = lambda self: {"active": "", "enabled": ""}  # noqa: E731

    def command(self, service):
        s = QuoteString(service)
        return StringCommand(
            "printf 'active=%s\\nenabled=%s\\n'",
            StringCommand('"$(systemctl is-active', s, '2>/dev/null)"'),
            StringCommand('"$(systemctl is-enabled', s, '2>/dev/null)"'),
        )

    def process(self, output):
        result = {"active": "", "enabled": ""}
        for line in output:
            key, _, value = line.partition("=")
            if key in result:
                result[key] = value.strip().splitlines()[0] if value.strip() else ""
        return result


class DockerVolumeInfo(FactBase):
    """`docker volume inspect <name>`'s object (Driver, Options, Labels, ...), or None when absent."""

    default = lambda self: None  # noqa: E731

    def command(self, volume):
        return StringCommand("docker volume inspect", QuoteString(volume), "2>/dev/null || echo '[]'")

    def process(self, output):
        try:
            data = json.loads("".join(output))
        except ValueError:
            return None
        return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


class VolumeContainers(FactBase):
    """Names of the containers (running or not) that use a docker volume."""

    default = list

    def command(self, volume):
        return StringCommand("docker ps -a --filter", QuoteString(f"volume={volume}"),
                             "--format '{{.Names}}' 2>/dev/null || true")

    def process(self, output):
        return [line.strip() for line in output if line.strip()]
