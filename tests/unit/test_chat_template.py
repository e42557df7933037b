"""model/chat_template.jinja rendered with jinja2 for each case, compared with prompts written out from the format in
docs/chat-template.md."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE = Path(__file__).resolve().parents[2] / "model" / "chat_template.jinja"

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
IMAGE = "<｜deepseek_image｜>"
D = "｜DSML｜"


def _raise(message):
    raise jinja2.TemplateError(message)


def _env(**options):
    # Like Hugging Face's renderer: a sandbox, tojson without key sorting or HTML escaping, raise_exception.
    env = ImmutableSandboxedEnvironment(**options)
    env.filters["tojson"] = lambda value, **_: json.dumps(value, ensure_ascii=False)
    env.globals["raise_exception"] = _raise
    return env


def render(messages, trim=True, **kwargs):
    options = {"trim_blocks": True, "lstrip_blocks": True} if trim else {}
    template = _env(**options).from_string(TEMPLATE.read_text())
    kwargs.setdefault("add_generation_prompt", True)
    return template.render(messages=messages, **kwargs)


HI = [{"role": "user", "content": "Hi"}]


def test_plain_defaults_to_thinking_at_effort_75():
    assert render(HI) == f"{BOS}Reasoning Effort: 75{USER}Hi{ASSISTANT}<think>"


def test_thinking_off_has_no_effort_line_and_closes_the_block():
    assert render(HI, enable_thinking=False) == f"{BOS}{USER}Hi{ASSISTANT}</think>"


def test_thinking_alias_is_read_when_enable_thinking_is_absent():
    assert render(HI, thinking=False) == f"{BOS}{USER}Hi{ASSISTANT}</think>"


def test_system_messages_are_joined_at_the_top():
    messages = [{"role": "system", "content": "Be brief."}, *HI, {"role": "system", "content": "Use French."}]
    assert render(messages, enable_thinking=False) == f"{BOS}Be brief.\n\nUse French.{USER}Hi{ASSISTANT}</think>"
    assert render(messages) == f"{BOS}Be brief.\n\nUse French.\n\nReasoning Effort: 75{USER}Hi{ASSISTANT}<think>"


def test_multi_turn_drops_earlier_reasoning():
    messages = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2", "reasoning_content": "one plus one"},
        {"role": "user", "content": "times 3?"},
    ]
    want = f"{BOS}Reasoning Effort: 75{USER}1+1?{ASSISTANT}</think>2{EOS}{USER}times 3?{ASSISTANT}<think>"
    assert render(messages) == want


def test_no_generation_prompt_ends_with_the_last_turn():
    messages = [*HI, {"role": "assistant", "content": "Hello"}]
    assert render(messages, enable_thinking=False, add_generation_prompt=False) == (
        f"{BOS}{USER}Hi{ASSISTANT}</think>Hello{EOS}"
    )


@pytest.mark.parametrize("effort, number", [
    ("minimal", 25), ("low", 50), ("medium", 62), ("high", 75), ("xhigh", 88), ("max", 100), ("HIGH", 75),
    (80, 80), ("90", 90), ("", 75), (None, 75),
])
def test_reasoning_effort_names_and_numbers(effort, number):
    assert render(HI, reasoning_effort=effort) == f"{BOS}Reasoning Effort: {number}{USER}Hi{ASSISTANT}<think>"


def test_effort_none_turns_thinking_off():
    assert render(HI, reasoning_effort="none") == f"{BOS}{USER}Hi{ASSISTANT}</think>"


def test_effort_is_ignored_when_thinking_is_off():
    assert render(HI, reasoning_effort="max", enable_thinking=False) == f"{BOS}{USER}Hi{ASSISTANT}</think>"


@pytest.mark.parametrize("effort", ["turbo", 0, 101, "250"])
def test_bad_effort_is_refused(effort):
    with pytest.raises(jinja2.TemplateError):
        render(HI, reasoning_effort=effort)


TOOL = {
    "type": "function",
    "function": {
        "name": "add_tags",
        "description": "Tag a document.",
        "parameters": {"type": "object", "properties": {"doc_id": {"type": "integer"},
                                                        "tags": {"type": "array", "items": {"type": "string"}}}},
    },
}
TOOLS_SECTION = (
    "## Tools\n\nYou can call the functions listed below. To call one or more, write a block in exactly this form:\n\n"
    f"<{D}function_calls>\n"
    f'<{D}invoke name="FUNCTION">\n'
    f'<{D}parameter name="PARAMETER" string="true">a string value, written as it is</{D}parameter>\n'
    f'<{D}parameter name="PARAMETER" string="false">any other value, as JSON</{D}parameter>\n'
    f"</{D}invoke>\n"
    f"</{D}function_calls>\n\n"
    "Each result comes back in a <result> element inside <function_results>, in the order of the calls.\n\n"
    "<functions>\n"
    '{"name": "add_tags", "description": "Tag a document.", "parameters": {"type": "object", "properties": '
    '{"doc_id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}}}\n'
    "</functions>"
)


def test_tools_are_described_after_the_system_prompt():
    messages = [{"role": "system", "content": "S"}, *HI]
    assert render(messages, tools=[TOOL], enable_thinking=False) == (
        f"{BOS}S\n\n{TOOLS_SECTION}{USER}Hi{ASSISTANT}</think>"
    )
    assert render(HI, tools=[TOOL]) == f"{BOS}{TOOLS_SECTION}\n\nReasoning Effort: 75{USER}Hi{ASSISTANT}<think>"


def _call(arguments, name="add_tags"):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_call_and_results_in_the_current_turn_keep_reasoning():
    messages = [
        {"role": "user", "content": "Tag 42 urgent."},
        {"role": "assistant", "content": "", "reasoning_content": "use the tool",
         "tool_calls": [_call({"doc_id": 42, "tags": ["urgent"], "note": "a <b>"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    want = (
        f"{BOS}{TOOLS_SECTION}\n\nReasoning Effort: 75{USER}Tag 42 urgent.{ASSISTANT}<think>use the tool</think>"
        f"<{D}function_calls>\n"
        f'<{D}invoke name="add_tags">\n'
        f'<{D}parameter name="doc_id" string="false">42</{D}parameter>\n'
        f'<{D}parameter name="tags" string="false">["urgent"]</{D}parameter>\n'
        f'<{D}parameter name="note" string="true">a <b></{D}parameter>\n'
        f"</{D}invoke>\n"
        f"</{D}function_calls>{EOS}"
        f"{USER}<function_results>\n<result>done</result>\n</function_results>{ASSISTANT}<think>"
    )
    assert render(messages, tools=[TOOL]) == want


def test_parallel_calls_string_arguments_and_grouped_results():
    messages = [
        {"role": "user", "content": "Two."},
        {"role": "assistant", "content": "Calling.", "tool_calls": [_call('{"doc_id": 1}'), _call({}, "ping")]},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "assistant", "content": "Both done."},
        {"role": "user", "content": "Thanks"},
    ]
    want = (
        f"{BOS}{USER}Two.{ASSISTANT}</think>Calling.\n\n<{D}function_calls>\n"
        f'<{D}invoke name="add_tags">\n{{"doc_id": 1}}\n</{D}invoke>\n'
        f'<{D}invoke name="ping">\n</{D}invoke>\n'
        f"</{D}function_calls>{EOS}"
        f"{USER}<function_results>\n<result>r1</result>\n<result>r2</result>\n</function_results>"
        f"{ASSISTANT}</think>Both done.{EOS}{USER}Thanks{ASSISTANT}</think>"
    )
    assert render(messages, enable_thinking=False) == want


def test_images_in_user_turns_and_tool_results():
    png = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        {"role": "user",
         "content": [{"type": "text", "text": "Compare "}, png, {"type": "text", "text": " and "}, png]},
        {"role": "assistant", "content": None, "tool_calls": [_call({"name": "shot"}, "screenshot")]},
        {"role": "tool", "content": [{"type": "text", "text": "screen: "}, png]},
    ]
    want = (
        f"{BOS}{USER}Compare {IMAGE} and {IMAGE}{ASSISTANT}</think>"
        f'<{D}function_calls>\n<{D}invoke name="screenshot">\n'
        f'<{D}parameter name="name" string="true">shot</{D}parameter>\n</{D}invoke>\n</{D}function_calls>{EOS}'
        f"{USER}<function_results>\n<result>screen: {IMAGE}</result>\n</function_results>{ASSISTANT}</think>"
    )
    assert render(messages, enable_thinking=False) == want


def test_same_output_without_trim_blocks():
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Tag."},
        {"role": "assistant", "content": "ok", "tool_calls": [_call({"tags": ["a", "b"]})]},
        {"role": "tool", "content": "done"},
    ]
    for kwargs in ({}, {"enable_thinking": False}, {"reasoning_effort": "low"}):
        assert render(messages, trim=False, tools=[TOOL], **kwargs) == render(messages, tools=[TOOL], **kwargs)
