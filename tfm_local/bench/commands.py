"""tfm-bench: the benchmarks as one command with subcommands (``tfm-bench pass ...``, ``tfm-bench trees ...``).

    tfm-bench [run] [options]        τ and tokens/s on prompt sets (no command: the same)
    tfm-bench COMMAND [options]      one of ``COMMANDS``
    tfm-bench --help                 the commands, one line each; ``tfm-bench COMMAND --help``: its options
    python -m tfm_local.bench ...    the same without the console script

Only the chosen command's module is imported, and its ``main(argv)`` runs with the arguments after the
command's name, under the name "tfm-bench COMMAND" (``cli.program.running_as``: its usage lines and
errors say so). The old console scripts (``tfm-bench-pass``, ...: ``ALIASES``) run the same mains under
their old names, for one more release.
"""
from __future__ import annotations

import importlib
import sys
import textwrap
from typing import NamedTuple

from ..cli.program import running_as

PROG = "tfm-bench"


class Command(NamedTuple):
    module: str   # under tfm_local.bench; its main(argv) runs the command
    alias: str | None  # the old console script of the same main (None: a command that never had one)
    summary: str  # one line for ``tfm-bench --help``


#: the subcommands, in the order ``tfm-bench --help`` lists them; "run" is also the default
COMMANDS: dict[str, Command] = {
    "run": Command("tfm_bench", "tfm-bench", "τ and tokens/s of plain decoding and the drafting methods on prompt "
                                             "sets (the default)"),
    "pass": Command("passes_cli", "tfm-bench-pass", "where one target (or drafter) pass of n tokens spends its time"),
    "verify": Command("verify_step_cli", "tfm-bench-verify",
                      "one full verify step of a random-weight Gated-DeltaNet hybrid"),
    "gdn": Command("gdn_cli", "tfm-bench-gdn", "the Gated DeltaNet tree ops against per-branch recurrent verification"),
    "trees": Command("trees", "tfm-bench-trees", "ms of a tree with a Weaver: the TfM heap against DARTree, host and "
                                                 "backend"),
    "replay": Command("replay_cli", "tfm-bench-replay", "chain τ of drafters replayed on a tfm-bench run's recorded "
                                                        "outputs"),
    "twin": Command("twin", "tfm-bench-twin", "random-weight twins of real targets (their tensor types) and drafters"),
    "project": Command("project", "tfm-bench-project",
                       "projected speed-ups from one run's step costs and another's τ"),
    "soak": Command("soak", "tfm-bench-soak", "many generations in one process: caches checked, memory growth"),
    "cache": Command("prompt_cache", None, "a follow-up chat turn with the prompt cache against cold: TTFT, "
                                                  "tokens prefilled"),
    "structured": Command("structured", None, "plain against speculative decoding under a grammar: JSON "
                                              "schema answers and forced tool calls"),
    "load": Command("load", "tfm-bench-load", "tfm-serve under concurrent streaming clients, dropped streams and bad "
                                              "bodies"),
}
#: old console-script name -> command
ALIASES = {c.alias: name for name, c in COMMANDS.items() if c.alias not in (None, PROG)}


def overview() -> str:
    """The text of ``tfm-bench --help``: usage, the commands one line each, where each one's options are."""
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {c.summary}" for name, c in COMMANDS.items())
    tail = textwrap.fill(f"A command's options: {PROG} COMMAND --help. The old names ({', '.join(ALIASES)}) run "
                         "the same commands for one more release.", 100, break_on_hyphens=False)
    return (f"usage: {PROG} [COMMAND] [options]\n\n"
            f"The benchmarks of tfm-local. With no command {PROG} runs `run` with the options given.\n\n"
            f"commands:\n{rows}\n\n{tail}")


def main(argv: list[str] | None = None) -> int | None:
    """Run the command named by ``argv[0]`` (default ``sys.argv[1:]``) with the rest of ``argv``, or "run"
    with all of it when ``argv`` is empty or starts with an option. Returns the command's exit status
    (None = 0); 2 with one line on stderr for an unknown command; ``-h``/``--help`` first prints
    ``overview()`` and returns 0."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(overview())
        return 0
    if args and not args[0].startswith("-"):
        name, args, prog = args[0], args[1:], f"{PROG} {args[0]}"
        if name not in COMMANDS:
            print(f"{PROG}: unknown command {name!r}: choose one of {', '.join(COMMANDS)} (see {PROG} --help)",
                  file=sys.stderr)
            return 2
    else:
        name, prog = "run", PROG
    module = importlib.import_module(f"{__package__}.{COMMANDS[name].module}")
    with running_as(prog):
        return module.main(args)
