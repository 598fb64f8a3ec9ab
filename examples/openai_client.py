"""The official ``openai`` client against tfm-serve: a plain chat completion, a streamed one, then
log-probabilities and penalties.

Start the server first, in another terminal (it loads the default target and drafter; see the
README's Server section for its options):

    tfm-serve --model-name coder                     # http://127.0.0.1:8080/v1
    tfm-serve --target model.gguf --port 8081        # another target; the model id is the file's stem

then run

    python examples/openai_client.py --model coder
    python examples/openai_client.py --base-url http://127.0.0.1:8081/v1 --model model

With ``tfm-serve --api-key KEY`` (or ``$TFM_API_KEY``), pass the same key with ``--api-key``
(default ``$TFM_API_KEY``, else a placeholder: without a key the server checks none).

The third part asks for ``logprobs=True, top_logprobs=3`` and prints each token of the answer with its
log-probability under the target and its three most likely alternatives (the values come from the
target's logits whether or not the server speculated, up to a batched pass's float rounding); the
fourth adds ``frequency_penalty`` / ``presence_penalty`` (OpenAI's fields) and llama.cpp's
``repeat_penalty`` (an extension field, through ``extra_body``); the last is a text completion with
the legacy ``logprobs`` shape.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import math

from openai import APIConnectionError, APIStatusError, OpenAI


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the server's /v1 URL")
    ap.add_argument("--model", default=None,
                    help="model id (default: the first the server lists at /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("TFM_API_KEY") or "unused",
                    help="the key given to tfm-serve --api-key (default $TFM_API_KEY)")
    ap.add_argument("--prompt", default="Write a Python function that reverses a string.")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    messages = [{"role": "user", "content": args.prompt}]

    # 1. A plain completion: the whole answer at once, with the usage counts.
    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                          temperature=0)
    print(resp.choices[0].message.content)
    usage = resp.usage
    print(f"finish_reason: {resp.choices[0].finish_reason}")
    print(f"usage: prompt_tokens={usage.prompt_tokens} completion_tokens={usage.completion_tokens} "
          f"total_tokens={usage.total_tokens}")
    tfm = (usage.model_extra or {}).get("tfm")  # tfm-serve's extra field: tau, tokens/s, timings
    if tfm is not None:
        print(f"usage.tfm: tau {tfm['tau']}, {tfm['tokens_per_s']} tokens/s; {json.dumps(tfm)}")

    # 2. Streamed: server-sent events, one text piece per chunk; stream_options asks for a last
    #    chunk that carries the usage (and no choices).
    print("\nstreamed (temperature 0.7, seed 1):")
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                            temperature=0.7, seed=1, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        elif chunk.usage is not None:
            print(f"\nusage: completion_tokens={chunk.usage.completion_tokens}")

    # 3. Each token's log-probability and its 3 most likely alternatives (greedy: the token is the first).
    print("\nlogprobs:")
    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                          temperature=0, logprobs=True, top_logprobs=3)
    for entry in resp.choices[0].logprobs.content:
        alts = ", ".join(f"{a.token!r} {a.logprob:.3f}" for a in entry.top_logprobs)
        print(f"token {entry.token!r}: logprob {entry.logprob:.3f} (p {math.exp(entry.logprob):.3f}); top 3: {alts}")

    # 4. Penalties: OpenAI's two, and llama.cpp's repeat penalty as an extension field.
    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                          temperature=0, frequency_penalty=1.0, presence_penalty=0.5,
                                          extra_body={"repeat_penalty": 1.1, "repeat_last_n": 64})
    print(f"\nwith penalties: {resp.choices[0].message.content!r}")

    # 5. A text completion's legacy logprobs: tokens, token_logprobs, top_logprobs, text_offset.
    prompt = "def reverse(s):"
    resp = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, logprobs=2)
    lp = resp.choices[0].logprobs
    print(f"completion of {prompt!r}: tokens {lp.tokens}")
    print(f"text_offset (from the start of the prompt): {lp.text_offset}")


if __name__ == "__main__":
    try:
        main()
    except APIConnectionError as e:
        sys.exit(f"openai_client.py: no server answers at the base URL ({e}); start tfm-serve first")
    except APIStatusError as e:
        sys.exit(f"openai_client.py: the server refused the request: {e}")
