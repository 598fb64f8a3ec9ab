"""tfm-chat: terminal chat with speculative decoding on a GGUF target."""
from __future__ import annotations

import argparse
import sys

from .common import add_engine_args, add_sampling_args, engine_from_args, fail, sampling_kwargs


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tfm-chat", description="Chat with a local GGUF model, decoded speculatively "
                                 "with a DFlash drafter (output identical to plain decoding).")
    add_engine_args(ap)
    add_sampling_args(ap)
    ap.add_argument("--prompt", help="answer this one message and exit (non-interactive)")
    ap.add_argument("--system", help="system message")
    ap.add_argument("--max-tokens", type=int, default=1024, help="new tokens per answer (default 1024)")
    ap.add_argument("--no-stats", action="store_true", help="do not print the stats line")
    return ap.parse_args(argv)


def answer(engine, messages: list[dict], args) -> str:
    """Stream one answer to stdout; Ctrl-C stops it early. Returns the text produced."""
    parts = []
    try:
        for piece in engine.generate(messages, max_tokens=args.max_tokens, stream=True, **sampling_kwargs(args)):
            parts.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        engine.stats.finish_reason = "interrupted"
    sys.stdout.write("\n")
    if not args.no_stats:
        print(f"[{engine.stats.summary()}]", file=sys.stderr)
    return "".join(parts)


def interactive(engine, args) -> None:
    """Multi-turn chat with line editing and history; /reset clears the conversation, /quit exits."""
    from prompt_toolkit import PromptSession

    session = PromptSession()
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    print("tfm-chat — /reset clears the conversation, /quit or Ctrl-D exits.", file=sys.stderr)
    while True:
        try:
            line = session.prompt("> ")
        except KeyboardInterrupt:
            continue
        except EOFError:
            return
        if not line.strip():
            continue
        if line.strip() in ("/quit", "/exit"):
            return
        if line.strip() == "/reset":
            history.clear()
            print("(conversation cleared)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        try:
            reply = answer(engine, system + history, args)
        except ValueError as e:  # the conversation outgrew the context
            history.pop()
            print(f"error: {e}\n(type /reset to start a new conversation)", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": reply})


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.max_tokens < 1:
        fail("--max-tokens must be >= 1")
    engine = engine_from_args(args)
    try:
        if args.prompt is not None:
            msgs = ([{"role": "system", "content": args.system}] if args.system else [])
            answer(engine, msgs + [{"role": "user", "content": args.prompt}], args)
        else:
            interactive(engine, args)
    except ValueError as e:  # prompt over the context, bad sampling values
        fail(str(e))
    except BrokenPipeError:  # e.g. `tfm-chat ... | head`
        sys.stderr.close()
    finally:
        engine.close()


if __name__ == "__main__":
    main()
