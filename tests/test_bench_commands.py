"""tfm-bench's commands (tfm_local/bench/commands.py): the overview, each command's help and errors under the
"tfm-bench COMMAND" spelling, an unknown command, the old tfm-bench-* names, and only the chosen tool imported."""
from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tfm_local.bench.commands import ALIASES, COMMANDS, main
from tfm_local.bench.provenance import problems
from tfm_local.cli.program import alias_note, dispatched, program_name, running_as

REPO = Path(__file__).resolve().parents[1]


def _scripts() -> dict[str, str]:
    """pyproject's tfm-bench* console scripts: name -> "module:function" (a regex: no tomllib on 3.10)."""
    return dict(re.findall(r'^(tfm-bench[\w-]*) = "([\w.]+:\w+)"$', (REPO / "pyproject.toml").read_text(), re.M))


def _entry(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def test_help_lists_every_command_with_one_line(capsys):
    assert main(["-h"]) == 0
    short = capsys.readouterr().out
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert short == out
    assert out.startswith("usage: tfm-bench [COMMAND] [options]\n")
    listed = re.findall(r"^  (\S+) +(\S.*)$", out, re.M)
    assert [name for name, _ in listed] == list(COMMANDS) and len(COMMANDS) == 12
    assert all(summary == COMMANDS[name].summary for name, summary in listed)
    assert all(alias in out for alias in ALIASES) and len(ALIASES) == 9


def test_the_console_scripts_are_the_dispatcher_and_the_old_names():
    """``tfm-bench`` is the dispatcher; each old name runs its command's module's main."""
    scripts = _scripts()
    assert scripts.pop("tfm-bench") == "tfm_local.bench.commands:main"
    assert scripts == {alias: f"tfm_local.bench.{COMMANDS[name].module}:main" for alias, name in ALIASES.items()}
    assert set(ALIASES.values()) == set(COMMANDS) - {"run", "cache", "structured"}  # cache and structured came after the renaming


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_commands_help_is_its_tools_help_under_the_new_spelling(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tfm-bench {name} ") and "old name" not in out
    assert not dispatched() and program_name("x") == "x"  # the name is the tool's own again afterwards


def test_an_old_name_runs_the_same_tool_under_its_own_name(capsys):
    """``tfm-bench-trees --help`` (its console script's function) works as before, and names the new spelling."""
    with pytest.raises(SystemExit) as e:
        _entry(_scripts()["tfm-bench-trees"])(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: tfm-bench-trees ") and "Also spelled `tfm-bench trees`" in out


def test_an_unknown_command_is_one_clear_line(capsys):
    assert main(["tree", "--budgets", "16"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1
    assert cap.err.startswith("tfm-bench: unknown command 'tree': choose one of run, pass,") and "--help" in cap.err


def test_errors_name_the_command_as_spelled(tmp_path, capsys):
    """A tool's own error lines, argparse's and ``cli.common.fail``'s say "tfm-bench COMMAND"; the same tool
    called through its old main keeps its old prefix."""
    from tfm_local.bench import trees

    bad_width = ["--weaver", str(tmp_path / "w.gguf"), "--width", "100000"]
    assert main(["trees", *bad_width]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfm-bench trees: --width 100000") and err.count("\n") == 1
    assert trees.main(bad_width) == 2
    assert capsys.readouterr().err.startswith("tfm-bench-trees: --width 100000")
    with pytest.raises(SystemExit) as e:  # argparse
        main(["pass", "--tokens", "0"])
    assert e.value.code == 2 and "tfm-bench pass: error: argument --tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # cli.common.fail
        main(["replay", "--from", str(tmp_path / "none.json"), "--drafter", "d.gguf"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("tfm-bench replay: error: cannot use --from") and err.count("\n") == 1
    with pytest.raises(SystemExit) as e:  # a tool's SystemExit message
        main(["twin", "--shape", "2,256,512,4,2,1024", "--drafter-type", "q9", "--out", str(tmp_path / "t")])
    assert str(e.value.code).startswith("tfm-bench twin: --drafter-type")
    with pytest.raises(SystemExit) as e:
        main(["project", "--costs", str(tmp_path / "none.json"), "--tau", str(tmp_path / "none.json")])
    assert str(e.value.code).startswith("tfm-bench project: cannot read")
    assert not dispatched()


@pytest.mark.parametrize("argv", [["--help"], ["trees", "--help"], ["nope"]])
def test_only_the_chosen_tool_is_imported(argv):
    code = ("import sys\nfrom tfm_local.bench.commands import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(','.join(sorted(m for m in sys.modules if m.startswith('tfm_local.bench.'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.strip().splitlines()[-1].split(","))
    assert loaded == {"tfm_local.bench.commands"} | ({"tfm_local.bench.trees"} if argv[0] == "trees" else set())


def test_program_name_and_running_as():
    assert program_name("tfm-bench-pass") == "tfm-bench-pass" and not dispatched()
    assert alias_note("tfm-bench pass") is not None
    with running_as("tfm-bench pass"):
        assert program_name("tfm-bench-pass") == "tfm-bench pass" and dispatched()
        assert alias_note("tfm-bench pass") is None
        with running_as("tfm-bench trees"):
            assert program_name() == "tfm-bench trees"
        assert program_name() == "tfm-bench pass"
    assert program_name() == Path(sys.argv[0]).name
    with pytest.raises(ValueError, match="non-empty"):
        with running_as(""):
            pass


@pytest.mark.parametrize("spelling", [["run"], []])
def test_a_dispatched_run_records_its_own_arguments(tiny_pair, tmp_path, spelling):
    """``tfm-bench run ...`` and plain ``tfm-bench ...`` run the end-to-end benchmark: its JSON's ``argv`` is
    the benchmark's own arguments, ``command`` the whole command line, and the provenance is complete."""
    target, drafter = tiny_pair
    out = tmp_path / "b.json"
    args = ["--target", str(target), "--drafter", str(drafter), "--sets", "gsm8k", "-n", "1", "--max-tokens", "6",
            "--modes", "plain,chain", "--warmup-tokens", "0", "--no-plot", "--json", str(out)]
    r = subprocess.run([sys.executable, "-m", "tfm_local.bench", *spelling, *args], capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["argv"] == args and shlex.split(doc["command"])[1:] == spelling + args
    assert {row["mode"] for row in doc["summary"]} == {"plain", "chain"}
    assert problems(doc["provenance"], ["target", "drafter"]) == []
