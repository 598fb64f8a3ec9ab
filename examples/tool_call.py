"""The official ``openai`` client against tfm-serve: forced tool calls and the tool loop.

Start the server first, in another terminal (the default target, Qwen2.5-Coder-1.5B-Instruct, has a chat
template that renders tools):

    tfm-serve --model-name coder

then run

    python examples/tool_call.py --model coder

``tool_choice`` naming a function forces one call of it: the server generates under a grammar that
allows only a ``<tool_call>`` block with that name and arguments that follow the function's
``parameters`` JSON schema, so ``message.tool_calls`` always holds the call and its arguments always
parse. The script runs the (made-up) tool, sends its result back as a ``tool`` message and prints the
model's final answer. Then ``tool_choice="required"`` lets the model pick one of the tools.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from openai import APIConnectionError, APIStatusError, OpenAI

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 40},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                       "required": ["city"], "additionalProperties": False}}},
]


def run_tool(name: str, args: dict) -> str:
    """A stand-in for the real tools."""
    if name == "get_weather":
        return json.dumps({"city": args["city"], "temperature": 21, "unit": args["unit"], "sky": "sunny"})
    return json.dumps({"city": args["city"], "time": "14:05"})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the server's /v1 URL")
    ap.add_argument("--model", default=None, help="model id (default: the first the server lists at /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("TFM_API_KEY") or "unused",
                    help="the key given to tfm-serve --api-key (default $TFM_API_KEY)")
    ap.add_argument("--prompt", default="Should I take an umbrella in Lisbon today?")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    messages = [{"role": "user", "content": args.prompt}]

    # 1. A named tool_choice forces one call of that function, its arguments valid for its schema.
    resp = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0,
                                          max_tokens=args.max_tokens,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = resp.choices[0]
    print(f"finish_reason: {choice.finish_reason}")
    for call in choice.message.tool_calls or []:
        print(f"call: {call.function.name} {call.function.arguments}")

    # 2. The loop: the assistant's message as it came, then one tool message per call; the model answers
    #    (tool_choice "none" asks for text now: a small model may otherwise call the tool again).
    if choice.finish_reason == "tool_calls":
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls:
            result = run_tool(call.function.name, json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        resp = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",
                                              temperature=0, max_tokens=args.max_tokens)
        final = resp.choices[0]
        calls = [f"{c.function.name} {c.function.arguments}" for c in final.message.tool_calls or []]
        print(f"answer ({final.finish_reason}): {final.message.content if not calls else 'another call: ' + '; '.join(calls)}")

    # 3. "required": one call of any of the tools, the model's pick.
    resp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What time is it in Oslo?"}],
                                          tools=TOOLS, tool_choice="required", temperature=0,
                                          max_tokens=args.max_tokens)
    for call in resp.choices[0].message.tool_calls or []:
        print(f"required: {call.function.name} {call.function.arguments}")


if __name__ == "__main__":
    try:
        main()
    except APIConnectionError as e:
        sys.exit(f"tool_call.py: no server answers at the base URL ({e}); start tfm-serve first")
    except APIStatusError as e:
        sys.exit(f"tool_call.py: the server refused the request: {e}")
