"""Chat messages of a request → the dicts the model's GGUF chat template renders.

A conversation that holds tool use (``tool`` results, assistant ``tool_calls``:
this server's own earlier answers in a client's loop, or another model's) is
rendered when the model's chat template renders tool use, with each call's
``arguments`` (a JSON string on the wire) given to the template as an object,
as Hugging Face templates expect. A template that does not render tool use
would silently mangle such messages, so they are a 400 there. Whether a
template renders a request's ``tools`` is ``template_takes_tools``.
"""
from __future__ import annotations

import json
import re

import jinja2
import jinja2.meta

from .errors import APIError
from .schemas import Message, ToolCall

#: Chat roles a request may use; "developer" (OpenAI's newer name) is rendered as "system".
ROLES = ("system", "developer", "user", "assistant", "tool")

_TOOL_USE = re.compile(r"""tool_calls|["']tool["']""")


def template_renders_tools(template: str | None) -> bool:
    """True when a chat template's Jinja source handles tool use: it reads ``tool_calls`` or tests a
    role against "tool" (Qwen2.5, Llama 3.1, Mistral... do; plain ChatML does not)."""
    return bool(template) and _TOOL_USE.search(template) is not None


def template_takes_tools(template: str | None) -> bool:
    """True when a chat template's Jinja source reads the ``tools`` variable (the tool definitions of a
    request, as Hugging Face's ``apply_chat_template(tools=...)`` passes them); False for no template or
    one Jinja cannot parse."""
    if not template:
        return False
    try:
        ast = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).parse(template)
    except jinja2.TemplateError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(ast)


def _call(call: ToolCall) -> dict:
    """One tool call for the template; ``arguments`` holding a JSON object is decoded."""
    args = call.function.arguments
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except ValueError:
            decoded = None
        args = decoded if isinstance(decoded, dict) else args
    out = {"type": "function", "function": {"name": call.function.name, "arguments": args}}
    return {"id": call.id, **out} if call.id is not None else out


def template_messages(messages: list[Message], tools_ok: bool) -> list[dict]:
    """``messages`` as ``{"role", "content"}`` dicts (text parts joined), plus ``tool_calls`` on assistant
    messages and ``tool_call_id`` / ``name`` on tool results, for the chat template.

    ``tools_ok``: the template renders tool use (``template_renders_tools``).
    Raises APIError 400: no messages (empty_array), an unknown role or ``tool_calls`` outside an
    assistant message (invalid_value), tool use the template does not render (unsupported_value).
    """
    if not messages:
        raise APIError(400, "'messages' must hold at least one message.", param="messages", code="empty_array")
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise APIError(400, f"Invalid value for 'messages[{i}].role': {m.role!r}; supported roles are "
                           f"{', '.join(ROLES)}.", param=f"messages[{i}].role", code="invalid_value")
        if m.tool_calls and m.role != "assistant":
            raise APIError(400, f"'messages[{i}].tool_calls': only assistant messages hold tool calls.",
                           param=f"messages[{i}].tool_calls", code="invalid_value")
        used = "role" if m.role == "tool" else "tool_calls" if m.tool_calls else None
        if used and not tools_ok:
            raise APIError(400, f"'messages[{i}].{used}': this model's chat template does not render tool calls "
                           "or tool results (and so this server has no function calling with it); leave them out.",
                           param=f"messages[{i}].{used}", code="unsupported_value")
        d = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [_call(c) for c in m.tool_calls]
        if m.role == "tool":
            d.update({k: v for k, v in (("tool_call_id", m.tool_call_id), ("name", m.name)) if v is not None})
        out.append(d)
    return out
