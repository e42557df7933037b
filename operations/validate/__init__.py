"""A validation client for a running sparkfold server (any OpenAI-compatible base URL): text, thinking on/off,
tools (plain, streamed, a tool result, tool_choice), image input, a long prompt, needle in a long context, end of
turn, smoke, prompt reuse, the Anthropic route, bench/compare, and exact record/compare.

Run as `python -m operations.validate --base-url URL CHECK...`; docs/validate.md lists the checks. Exit codes:
0 passed, 1 failed, 2 could not run, 3 ran but could not verify."""
