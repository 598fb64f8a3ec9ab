"""tfm-chat: terminal chat with speculative decoding on a GGUF target.

The whole conversation is kept and rendered with the target's chat template
at every turn. A line starting with ``/`` is a command (``HELP``); ``//``
sends a line that starts with ``/``. Answers go to stdout; the stats line,
command replies and errors to stderr.

Ctrl-C during an answer stops it at the next token (the engine is never cut
inside a decoding step, so the next turn starts clean). The partial answer,
as shown, stays in the conversation; when nothing was shown yet the question
is dropped too. A second Ctrl-C during the same answer quits at once. Ctrl-C
or Ctrl-D at an empty prompt exits (status 0).

With stdin a terminal, messages are read with prompt_toolkit (editing and
history); a paste is one message whatever its lines (``prompt_session``), and
so is a message typed between two ``FENCE`` marks. Otherwise each line of
stdin is one turn or command, read plainly.

A conversation that outgrows the context loses its oldest turns, whole, the
system prompt kept (``Chat.fit``, ``conversation.fit_conversation``), said once
on stderr; ``--no-truncate`` refuses the message instead.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import sys
from typing import Iterator

from .common import (LOSSLESS, add_engine_args, add_sampling_args, budget_arg, check_weaver_use, engine_from_args,
                     fail, sampling_kwargs)

HELP = """commands:
  /reset             clear the conversation (the system prompt stays)
  /stats             the last answer's stats and the session totals
  /temp [X]          set the temperature (X >= 0; 0 = greedy), or show it
  /budget [auto|N]   draft tokens verified per step (auto, or N >= 0; 0 = plain), or show it
  /system [TEXT|-]   set the system prompt (clears the conversation), - removes it; alone: show it
  /help              this list
  /exit, /quit       leave (also Ctrl-D, or Ctrl-C at an empty prompt)
Ctrl-C during an answer stops it; the part shown stays in the conversation.
A line starting with // is sent as a message starting with /.
A pasted text is one message, whatever its lines. To type several lines: Alt-Enter (or Esc, Enter)
starts a new line, or open the message with \"\"\" and close it with \"\"\" (Enter then sends it).
Piped input: each line is one message or command.
A conversation that outgrows the context (--n-ctx) loses its oldest turns (said once)."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tfm-chat", description="Chat in the terminal with a local GGUF model (the "
                                 "default: Qwen2.5-Coder-1.5B-Instruct), decoded speculatively with a DFlash "
                                 "drafter. " + LOSSLESS,
                                 epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    add_sampling_args(ap)
    ap.add_argument("--prompt", help="answer this one message and exit (non-interactive)")
    ap.add_argument("--system", help="system message")
    ap.add_argument("--max-tokens", type=int, default=1024, help="new tokens per answer (default 1024)")
    ap.add_argument("--no-stats", action="store_true", help="do not print the stats line")
    ap.add_argument("--no-truncate", action="store_true",
                    help="refuse a message once the conversation outgrows the context (/reset starts afresh), "
                         "instead of leaving its oldest turns out (the default: the system prompt stays, and "
                         "room for --max-tokens is kept, at most half the context)")
    return ap.parse_args(argv)


def info(msg: str) -> None:
    """A message for the user that is not part of an answer (stderr)."""
    print(msg, file=sys.stderr, flush=True)


class StopOnCtrlC:
    """SIGINT handling for the time of one answer (a context manager).

    The first Ctrl-C sets ``requested``: the answer loop stops at the next
    piece of text, so the engine is only ever stopped between decoding steps.
    A second Ctrl-C raises KeyboardInterrupt at once (quit). The previous
    handler is restored on exit.
    """

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self) -> "StopOnCtrlC":
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def answer(engine, messages: list[dict], args) -> tuple[str, bool]:
    """Stream one answer to stdout. Returns (the text shown, whether Ctrl-C stopped it).

    Raises ValueError (before any output) when the conversation does not fit the context.
    """
    parts, stopped = [], False
    stream = engine.generate(messages, max_tokens=args.max_tokens, stream=True, **sampling_kwargs(args))
    try:
        with StopOnCtrlC() as ctrl_c:
            for piece in stream:
                if ctrl_c.requested:
                    stopped = True
                    break
                parts.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
    finally:
        stream.close()  # ends the generator at a token boundary; the next generate starts afresh
    sys.stdout.write("\n")
    sys.stdout.flush()
    if stopped:
        engine.stats.finish_reason = "interrupted"
        info("(answer stopped)")
    if not args.no_stats:
        info(f"[{engine.stats.summary()}]")
    return "".join(parts), stopped


def add_stats(total, stats) -> None:
    """Add the counters and times of one generation's stats to ``total`` (both GenerationStats)."""
    for f in dataclasses.fields(stats):
        a, b = getattr(total, f.name), getattr(stats, f.name)
        if isinstance(a, dict):  # t_phases
            setattr(total, f.name, {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()})
        elif f.name != "finish_reason":
            setattr(total, f.name, a + b)


class Chat:
    """A conversation with the engine: history, system prompt, settings and stats, driven by lines."""

    def __init__(self, engine, args):
        from ..decode.stats import GenerationStats

        self.engine, self.args = engine, args
        self.system: str | None = args.system
        self.history: list[dict] = []
        self.last = None                    # GenerationStats of the last answer
        self.total = GenerationStats()      # summed over the session's answers
        self.n_answers = 0
        self.told_truncation = False        # the line saying that old turns are left out was shown
        self.commands = {"/reset": self.cmd_reset, "/stats": self.cmd_stats, "/temp": self.cmd_temp,
                         "/budget": self.cmd_budget, "/system": self.cmd_system, "/help": self.cmd_help,
                         "/exit": self.cmd_exit, "/quit": self.cmd_exit}

    def messages(self) -> list[dict]:
        """The conversation as chat messages, system prompt first."""
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def handle(self, line: str) -> bool:
        """Act on one input line (a command or a message). Returns False when the chat should end."""
        text = line.strip()
        if not text:
            return True
        if "\n" in text:  # a pasted or fenced message: never a command
            return self.send(line)
        if text.startswith("//"):
            return self.send(line.lstrip()[1:])
        if text.startswith("/"):
            name, _, arg = text.partition(" ")
            cmd = self.commands.get(name)
            if cmd is None:
                info(f"unknown command {name}; /help lists the commands (// sends a line starting with /)")
                return True
            return cmd(arg.strip()) is not False
        return self.send(line)

    def send(self, text: str) -> bool:
        """Send one user message and stream the answer into the conversation."""
        from ..decode.verify import ContextOverflowError

        self.history.append({"role": "user", "content": text})
        try:
            self.fit()
            reply, stopped = answer(self.engine, self.messages(), self.args)
        except ContextOverflowError as e:
            self.history.pop()
            hint = self.history and self.args.no_truncate
            info(f"error: {e}" + ("\n(/reset starts a new conversation)" if hint else ""))
            return True
        except ValueError as e:  # e.g. the chat template rejects the conversation
            self.history.pop()
            info(f"error: {e}")
            return True
        if stopped and not reply:
            self.history.pop()  # nothing was shown: as if the question had not been asked
        else:
            self.history.append({"role": "assistant", "content": reply})
        self.last = self.engine.stats
        add_stats(self.total, self.last)
        self.n_answers += 1
        return True

    def fit(self) -> None:
        """Leave the oldest turns out of the history when the conversation, with room for the answer
        (``conversation.answer_room``), outgrows the context; say so the first time. Nothing with
        ``--no-truncate``. Raises ContextOverflowError when the system prompt and the last message alone
        do not fit."""
        from ..conversation import answer_room, fit_conversation

        if self.args.no_truncate:
            return
        n_ctx = self.engine.target.n_ctx
        fitted = fit_conversation(self.messages(), lambda m: len(self.engine.prompt_tokens(m)), n_ctx,
                                  answer_room(n_ctx, self.args.max_tokens))
        if not fitted.n_dropped:
            return
        del self.history[:fitted.n_dropped]
        if not self.told_truncation:
            self.told_truncation = True
            info(f"(the conversation outgrew the {n_ctx}-token context: its oldest turns are left out from "
                 "now on; --no-truncate refuses instead)")

    # -- commands: each takes the text after the command name ----------------------------
    def cmd_reset(self, arg: str) -> None:
        """/reset: clear the conversation; the system prompt stays."""
        if arg:
            return info("usage: /reset")
        self.history.clear()
        info("(conversation cleared)")

    def cmd_stats(self, arg: str) -> None:
        """/stats: the last answer's stats line and the session totals (τ, tok/s, tokens)."""
        if arg:
            return info("usage: /stats")
        if self.last is None:
            return info("no answers yet")
        t, n = self.total, self.n_answers
        info(f"last answer: [{self.last.summary()}]\n"
             f"session: {n} answer{'s' * (n != 1)}  τ={t.tau:.2f}  {t.tokens_per_s:.1f} tok/s  {t.n_generated} tokens")

    def cmd_temp(self, arg: str) -> None:
        """/temp [X]: set the sampling temperature (a finite number >= 0), or show it."""
        if not arg:
            return info(f"temperature {self.args.temperature:g}")
        try:
            value = float(arg)
        except ValueError:
            value = math.nan
        if not (value >= 0 and math.isfinite(value)):
            return info(f"error: temperature must be a number >= 0, got {arg!r}")
        self.args.temperature = value
        info(f"(temperature {value:g}{', greedy' if value == 0 else ''})")

    def cmd_budget(self, arg: str) -> None:
        """/budget [auto|N]: set the draft budget (Engine.set_budget), or show it."""
        eng = self.engine
        if arg:
            try:
                value = budget_arg(arg)
            except argparse.ArgumentTypeError as e:
                return info(f"error: {e}")
            if eng.drafter is None:
                return info("no drafter loaded (started with --no-draft or --budget 0): plain decoding only")
            eng.set_budget(value)
            if value != "auto" and eng.budget < value:
                return info(f"(budget {eng.budget}: the most this drafter and draft shape allow)")
        info(f"(budget {'auto' if eng.auto is not None else eng.budget}, {eng.tree_mode})"
             if eng.drafter is not None else "(plain decoding: no drafter loaded)")

    def cmd_system(self, arg: str) -> None:
        """/system [TEXT|-]: set or remove the system prompt (clearing the conversation), or show it."""
        if not arg:
            return info(f"system prompt: {self.system!r}" if self.system else "no system prompt")
        self.system = None if arg == "-" else arg
        self.history.clear()
        info("(system prompt removed; conversation cleared)" if self.system is None
             else "(system prompt set; conversation cleared)")

    def cmd_help(self, arg: str) -> None:
        """/help: the list of commands."""
        info(HELP)

    def cmd_exit(self, arg: str) -> bool:
        """/exit, /quit: end the chat."""
        return False


#: A message typed between two of these (at the start of the first line and the end of the last) may span lines.
FENCE = '"""'


def open_fence(text: str) -> bool:
    """Whether ``text`` (the line being typed) opens a ``FENCE``-delimited message not yet closed."""
    body = text.lstrip()
    return body.startswith(FENCE) and not body[len(FENCE):].rstrip().endswith(FENCE)


def unfence(text: str) -> str:
    """The message of a typed line: the text between the ``FENCE`` marks when it is fenced (one line break
    after the opening mark and one before the closing mark dropped), else ``text`` itself."""
    body = text.strip()
    if len(body) < 2 * len(FENCE) or not (body.startswith(FENCE) and body.endswith(FENCE)):
        return text
    inner = body[len(FENCE):-len(FENCE)]
    inner = inner[1:] if inner.startswith("\n") else inner
    return inner[:-1] if inner.endswith("\n") else inner


def input_pending(event) -> bool:
    """Whether more keys arrived with the Enter of ``event`` (in the same read, or waiting on stdin): a paste
    from a terminal without bracketed paste, where the paste's line breaks must not send it in pieces."""
    import select

    if event.key_processor.input_queue:
        return True
    try:
        return bool(select.select([event.app.input.fileno()], [], [], 0)[0])
    except (OSError, ValueError, NotImplementedError):  # closed, or an input without a file descriptor
        return False


def prompt_session():
    """A prompt_toolkit session with line editing and in-memory history. Ctrl-C clears a
    non-empty line and ends the input (EOFError) on an empty one, like Ctrl-D.

    Enter sends the line, except: inside a paste (bracketed paste, where the terminal marks it, or keys
    still arriving with the Enter, where it does not) and inside a ``FENCE``-opened message, where it
    starts a new line of the same message; Alt-Enter (or Esc, Enter) always starts a new line."""
    import os

    # Without cursor-position requests: prompt_toolkit otherwise keeps the terminal in raw mode
    # after Enter until the terminal answers (up to ~1 s when it does not), and a Ctrl-C typed
    # then is read as a key at the next prompt (ending the chat) instead of stopping the answer.
    os.environ.setdefault("PROMPT_TOOLKIT_NO_CPR", "1")
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.output import create_output

    keys = KeyBindings()

    @keys.add("enter")
    def _enter(event) -> None:
        buf = event.current_buffer
        if input_pending(event) or open_fence(buf.text):
            buf.insert_text("\n")
        else:
            buf.validate_and_handle()

    @keys.add("escape", "enter")
    def _new_line(event) -> None:
        event.current_buffer.insert_text("\n")

    @keys.add("c-c")
    def _ctrl_c(event) -> None:
        buf = event.app.current_buffer
        if buf.text:
            buf.reset()
        else:
            event.app.exit(exception=EOFError, style="class:exiting")

    # stdout redirected to a file: draw the prompt on the terminal of stderr, keeping its escape codes
    # out of the file
    redirect = not sys.stdout.isatty() and sys.stderr.isatty()
    return PromptSession(key_bindings=keys, output=create_output(stdout=sys.stderr) if redirect else None)


def tty_lines(session) -> Iterator[str]:
    """Inputs typed or pasted at ``session``'s prompt (one may span lines; fenced ones unfenced), until Ctrl-D
    or Ctrl-C at an empty prompt."""
    while True:
        try:
            yield unfence(session.prompt("> ", prompt_continuation=". "))
        except (EOFError, KeyboardInterrupt):
            return


def piped_lines() -> Iterator[str]:
    """Lines of a non-terminal stdin, without their line ending, until EOF."""
    for line in sys.stdin:
        yield line.rstrip("\r\n")


def interactive(engine, args) -> None:
    """Multi-turn chat until /exit, EOF or Ctrl-C at the prompt (or a second Ctrl-C during an answer)."""
    tty = sys.stdin.isatty()
    if tty:
        info("tfm-chat — /help lists the commands, Ctrl-D exits.")
    chat = Chat(engine, args)
    try:
        for line in (tty_lines(prompt_session()) if tty else piped_lines()):
            if not chat.handle(line):
                return
    except KeyboardInterrupt:  # outside an answer's first Ctrl-C: the user wants to leave
        return


def run(args) -> None:
    """Build the engine, then answer ``--prompt`` or chat; errors end the program with a message."""
    from ..decode.sampling import SamplingParams

    if args.max_tokens < 1:
        fail("--max-tokens must be >= 1")
    try:
        SamplingParams(**sampling_kwargs(args))
    except ValueError as e:
        fail(str(e))
    check_weaver_use(args)
    engine = engine_from_args(args)
    try:
        if args.prompt is not None:
            msgs = ([{"role": "system", "content": args.system}] if args.system else [])
            answer(engine, msgs + [{"role": "user", "content": args.prompt}], args)
        else:
            interactive(engine, args)
    except ValueError as e:  # prompt over the context
        fail(str(e))
    except BrokenPipeError:  # e.g. `tfm-chat ... | head`
        sys.stderr.close()
    finally:
        engine.close()


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        run(args)
    except KeyboardInterrupt:  # while loading, or a second Ctrl-C during a --prompt answer
        info("(interrupted)")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
