"""Facts about Docker and the NVIDIA container runtime: daemon.json, the live daemon's runtimes, what is installed,
and group membership of the ssh user."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from .host import HostTools

DAEMON_JSON = "/etc/docker/daemon.json"


class DaemonJson(FactBase):
    """daemon.json parsed: {"exists": bool, "config": dict | None, "error": str | None}.
    A missing or empty file is {} (dockerd's defaults); malformed JSON gives config None and the parser's error, so
    the operation can refuse to touch the file."""

    def command(self, path=DAEMON_JSON):
        q = shlex.quote(path)
        return f"if [ -e {q} ]; then echo '##EXISTS##'; cat {q} 2>&1 || true; else echo '##ABSENT##'; fi"

    @staticmethod
    def default():
        return {"exists": False, "config": {}, "error": None}

    def process(self, output):
        if not output or output[0].strip() != "##EXISTS##":
            return self.default()
        text = "\n".join(output[1:]).strip()
        if not text:
            return {"exists": True, "config": {}, "error": None}
        try:
            config = json.loads(text)
        except ValueError as e:
            return {"exists": True, "config": None, "error": str(e)}
        if not isinstance(config, dict):
            return {"exists": True, "config": None, "error": "the top level is not a JSON object"}
        return {"exists": True, "config": config, "error": None}


class DockerRuntimeInfo(FactBase):
    """The running daemon's view: {"reachable": bool, "default_runtime": str, "runtimes": [names]}."""

    command = (
        "if command -v docker >/dev/null 2>&1 && "
        "out=$(docker info --format '{{.DefaultRuntime}}|{{json .Runtimes}}' 2>/dev/null); "
        "then echo \"info=$out\"; else echo '##UNREACHABLE##'; fi"
    )

    @staticmethod
    def default():
        return {"reachable": False, "default_runtime": "", "runtimes": []}

    def process(self, output):
        for line in output:
            if line.startswith("info="):
                default, _, runtimes = line[len("info="):].partition("|")
                try:
                    names = sorted(json.loads(runtimes or "{}"))
                except ValueError:
                    names = []
                return {"reachable": True, "default_runtime": default.strip(), "runtimes": names}
        return self.default()


class ContainerRuntimeTools(HostTools):
    """Which pieces are on the PATH: {"docker", "dockerd", "nvidia-container-runtime",
    "nvidia-container-runtime-hook", "nvidia-ctk": bool}."""

    TOOLS = ("docker", "dockerd", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-ctk")


class UserGroups(FactBase):
    """The groups of `user` (`id -nG`); None when the user does not exist."""

    def command(self, user):
        return f"id -nG {shlex.quote(user)} 2>/dev/null || echo '##NO_USER##'"

    def process(self, output):
        line = " ".join(output).strip()
        if line == "##NO_USER##":
            return None
        return line.split()
