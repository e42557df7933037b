"""Helpers shared by the operations, each written once: shell commands, the plan-time check rule, owned files."""

from operations.util.checks import check_failed, failing_shell, warned
from operations.util.commands import MANAGED_HEADER, fail_command, sh

__all__ = ["MANAGED_HEADER", "check_failed", "fail_command", "failing_shell", "sh", "warned"]
