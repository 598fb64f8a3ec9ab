"""The official ``openai`` client against tfm-serve: structured outputs (a JSON schema, any JSON object,
a GBNF grammar).

Start the server first, in another terminal:

    tfm-serve --model-name coder

then run

    python examples/json_schema.py --model coder

``response_format={"type": "json_schema", ...}`` makes the answer a JSON value of the schema: the
server decodes under the schema's grammar (docs/structured-outputs.md), so the text always parses and
matches once the answer is complete (``finish_reason`` "stop"; "length" means ``max_tokens`` cut it).
``{"type": "json_object"}`` asks for any JSON object; the extension field ``grammar`` (through
``extra_body``) takes GBNF text, as llama.cpp's server does.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from openai import APIConnectionError, APIStatusError, OpenAI

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "language": {"enum": ["Python", "Rust", "Go", "C"]},
                         "student": {"type": "boolean"}},
          "required": ["name", "age", "language", "student"], "additionalProperties": False}
YES_NO = 'root ::= "Answer: " ("yes" | "no")'


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the server's /v1 URL")
    ap.add_argument("--model", default=None, help="model id (default: the first the server lists at /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("TFM_API_KEY") or "unused",
                    help="the key given to tfm-serve --api-key (default $TFM_API_KEY)")
    ap.add_argument("--max-tokens", type=int, default=200)
    args = ap.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id

    # 1. A JSON schema: the answer is a JSON object with exactly these fields and types.
    resp = client.chat.completions.create(
        model=model, temperature=0, max_tokens=args.max_tokens,
        messages=[{"role": "user", "content": "Invent a programmer: name, age, favourite language, student?"}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "programmer", "schema": PERSON, "strict": True}})
    choice = resp.choices[0]
    print(f"json_schema ({choice.finish_reason}): {choice.message.content}")
    if choice.finish_reason == "stop":
        person = json.loads(choice.message.content)
        print(f"parsed: {person['name']}, {person['age']}, {person['language']}, student={person['student']}")

    # 2. Any JSON object.
    resp = client.chat.completions.create(
        model=model, temperature=0, max_tokens=args.max_tokens, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}])
    print(f"json_object ({resp.choices[0].finish_reason}): {resp.choices[0].message.content}")

    # 3. A GBNF grammar (an extension field, as in llama.cpp's server).
    resp = client.chat.completions.create(
        model=model, temperature=0, max_tokens=16, extra_body={"grammar": YES_NO},
        messages=[{"role": "user", "content": "Is Python dynamically typed?"}])
    print(f"grammar: {resp.choices[0].message.content}")

    # 4. A schema the server cannot use is a 400 before anything is generated.
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}})
    except APIStatusError as e:
        print(f"bad schema: {e.status_code} {e.body.get('message') if isinstance(e.body, dict) else e.body}")


if __name__ == "__main__":
    try:
        main()
    except APIConnectionError as e:
        sys.exit(f"json_schema.py: no server answers at the base URL ({e}); start tfm-serve first")
    except APIStatusError as e:
        sys.exit(f"json_schema.py: the server refused the request: {e}")
