"""Helpers shared by the operations, each written once: shell commands, the failure styles, owned files."""

from operations.util.checks import RunStopped, check_failed, failing_shell, function_failed, warned
from operations.util.commands import MANAGED_HEADER, fail_command, sh

__all__ = ["MANAGED_HEADER", "RunStopped", "check_failed", "fail_command", "failing_shell", "function_failed", "sh",
           "warned"]
