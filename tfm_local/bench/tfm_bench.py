"""tfm-bench: τ and tokens/s of plain decoding, the chain and DDTree budgets on real prompt sets.

One engine is loaded once and switched between modes (``Engine.set_draft``);
each prompt runs every mode back to back, so machine noise hits all modes
alike, in an order rotated from prompt to prompt (``mode_order``), so that no mode always runs
first or right after another. Generation is greedy with the target's chat template; every mode first runs
once untimed on the first prompt (``--warmup-tokens``). Every
speculative mode's output is compared with plain decoding's: mismatches are
counted, not fatal (near-ties can flip with a different batch shape), and each
is checked (``tfm_local.lossless``): the table's "(not ties)" counts those that do
not start at a numerical near-tie, i.e. bugs, and a warning names them.
``--temperature`` > 0 (with ``--top-k/--top-p/--min-p``) samples instead, every mode of a prompt
with the same seed (``--seed``, default 0): plain and speculative decoding then emit the same tokens
wherever their logits agree, so mismatches are still counted; the near-tie check is greedy-only.
``--samplings "greedy;t=0.7,top_p=0.95;t=1"`` runs every mode under each setting, side by side per
prompt; each row's speed-up is over plain decoding with the same setting, and "x greedy" over plain
greedy decoding on the same set.
Prints a table, writes JSON (per prompt and per set; also after each prompt set but the last, marked
``"complete": false``, so that an interrupted run keeps its finished sets) and plots τ and tokens/s
against the budget B per prompt set (PNG); ``--plot-only`` redraws the plot
from a JSON file.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from typing import NamedTuple

from ..cli.common import (add_engine_args, add_sampling_args, check_writable, engine_from_args, fail, run_record,
                          sampling_kwargs, write_json as write_common_json)
from ..cli.program import program_name
from .provenance import provenance

SHAPES = ("chain", "ddtree", "wide", "tfm", "dartree", "lattice")
DEFAULT_MODES = "plain,chain,ddtree@16,ddtree@32,ddtree@64,ddtree@128,auto"


class Sampling(NamedTuple):
    """One ``--samplings`` setting: its label (``greedy``, ``t0.7 p0.95``, ...) and SamplingParams."""

    label: str
    sp: object


SAMPLING_KEYS = {"t": "temperature", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                 "min_p": "min_p"}


def parse_samplings(text: str, seed: int) -> list[Sampling]:
    """The ``;``-separated ``--samplings`` list: ``greedy`` or ``key=value,...`` with keys t (or
    temperature), top_k, top_p, min_p; every setting gets ``seed``. Raises ValueError for an unknown key, a
    bad value, a repeated or an empty list."""
    from ..decode.sampling import SamplingParams

    out = []
    for item in (t.strip() for t in text.split(";")):
        if not item:
            continue
        kw = {}
        if item != "greedy":
            for part in item.split(","):
                key, eq, val = part.strip().partition("=")
                if key not in SAMPLING_KEYS or not eq:
                    raise ValueError(f"bad sampling {item!r}: use greedy or key=value pairs with keys "
                                     f"t, top_k, top_p, min_p (e.g. t=0.7,top_p=0.95)")
                try:
                    kw[SAMPLING_KEYS[key]] = int(val) if key == "top_k" else float(val)
                except ValueError:
                    raise ValueError(f"bad value in sampling {item!r}: {part.strip()!r}") from None
        sp = SamplingParams(**kw, seed=seed)
        out.append(Sampling(sampling_label(sp), sp))
    if not out:
        raise ValueError("--samplings is empty")
    _refuse_repeats([s.label for s in out], "sampling(s)")
    return out


def _refuse_repeats(labels: list[str], what: str) -> None:
    """ValueError naming the labels given more than once."""
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"{what} given twice: {', '.join(dup)}")


def sampling_label(sp) -> str:
    """``greedy``, or the temperature and the filters that are on (``t0.7 k40 p0.95 min0.05``)."""
    if sp.greedy:
        return "greedy"
    parts = [f"t{sp.temperature:g}"] + ([f"k{sp.top_k}"] if sp.top_k else []) + (
        [f"p{sp.top_p:g}"] if sp.top_p < 1 else []) + ([f"min{sp.min_p:g}"] if sp.min_p > 0 else [])
    return " ".join(parts)


class Mode(NamedTuple):
    """One benchmark mode: its label, draft shape and requested budget (0 = plain, None = the
    engine's maximum, ``"auto"`` = chosen per step)."""

    label: str
    tree: str
    budget: int | str | None


def parse_mode(text: str) -> Mode:
    """One ``--modes`` item: ``plain``, ``chain``, ``auto`` (= ``chain@auto``), ``SHAPE@B`` or
    ``SHAPE@auto`` with SHAPE in chain, ddtree, wide, tfm, dartree, lattice (tfm needs ``--weaver``,
    dartree a Weaver or a DFlash2 drafter, lattice a DFlash2 drafter) and B an integer >= 1.

    Raises ValueError with a message for the user.
    """
    text = text.strip()
    if text == "plain":
        return Mode(text, "chain", 0)
    if text == "chain":
        return Mode(text, "chain", None)
    if text == "auto":
        return Mode(text, "chain", "auto")
    shape, at, b = text.partition("@")
    if shape in SHAPES and at and b == "auto":
        return Mode(text, shape, "auto")
    if shape in SHAPES and at and b.isdigit() and int(b) >= 1:
        return Mode(text, shape, int(b))
    raise ValueError(f"unknown mode {text!r}; use plain, chain, auto, chain@B, ddtree@B, wide@B, tfm@B, "
                     f"dartree@B, lattice@B (B an integer >= 1), or one of those shapes @auto (ddtree@auto)")


def parse_modes(text: str) -> list[Mode]:
    """The comma-separated ``--modes`` list; raises ValueError for an unknown, repeated or empty list."""
    modes = [parse_mode(t) for t in text.split(",") if t.strip()]
    if not modes:
        raise ValueError("--modes is empty")
    _refuse_repeats([m.label for m in modes], "mode(s)")
    return modes


def mode_order(modes: list, i: int) -> list:
    """The modes in the order prompt ``i`` runs them: rotated by ``i`` (prompt 0: as given). Whatever a
    run leaves behind for the next one (caches, clocks, allocator state) then falls on every mode alike
    over a set, instead of always on the same pair (the H200's plain and auto runs differed by 1–2% in
    a fixed order)."""
    k = i % len(modes) if modes else 0
    return list(modes[k:]) + list(modes[:k])


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench"), description=__doc__.split("\n")[0],
                                 epilog="The other benchmarks are tfm-bench's commands: tfm-bench --help lists them.")
    add_engine_args(ap)
    ap.set_defaults(budget=None, tree=None)  # --modes sets both; given explicitly they are an error
    ap.add_argument("--sets", default="humaneval,gsm8k,mtbench", help="comma-separated prompt sets")
    ap.add_argument("-n", "--n-prompts", type=int, default=40, help="first N prompts of each set (default 40)")
    ap.add_argument("--max-tokens", type=int, default=256, help="new tokens per prompt (default 256)")
    ap.add_argument("--modes", default=DEFAULT_MODES,
                    help="comma-separated: plain, chain, chain@B, ddtree@B, wide@B, tfm@B (with --weaver), dartree@B "
                         "(with --weaver or a DFlash2 drafter), lattice@B (a DFlash2 drafter), auto "
                         "(automatic budget with the chain), ddtree@auto (default %(default)s)")
    add_sampling_args(ap)
    ap.add_argument("--samplings", default=None, metavar="LIST",
                    help='run every mode under each of these settings, side by side per prompt: ";"-separated, '
                         'each "greedy" or key=value pairs (t, top_k, top_p, min_p), e.g. '
                         '"greedy;t=0.7,top_p=0.95;t=1" (instead of --temperature/--top-k/--top-p/--min-p)')
    ap.add_argument("--warmup-tokens", type=int, default=16,
                    help="untimed run of every mode on the first prompt first, this many tokens (default 16; 0 = none)")
    ap.add_argument("--json", default="bench.json", help="output JSON path (default bench.json)")
    ap.add_argument("--plot", default=None, help="output PNG path (default: the --json path with .png)")
    ap.add_argument("--no-plot", action="store_true", help="write no plot")
    ap.add_argument("--plot-only", metavar="JSON", default=None,
                    help="redraw the plot from an existing bench JSON and exit (no model is loaded)")
    return ap.parse_args(argv)


def run_one(engine, prompt, mode: Mode, max_tokens: int, sp=None) -> dict:
    """One prompt in one mode, greedy or with ``sp`` (a ``SamplingParams``); returns its stats, the
    budget used and the output ids.

    ``budget`` in the result is the engine's budget after clamping (block size - 1 for the chain,
    the batch size - 1 for trees), or ``"auto"`` with its cap in ``budget_max``.
    """
    from ..decode.sampling import SamplingParams

    engine.set_draft(mode.tree, mode.budget)
    ids = engine.prompt_tokens(prompt.messages)
    out = list(engine.generate_ids(ids, max_tokens, sp or SamplingParams()))
    d = engine.stats.to_dict()
    d.update(prompt_id=prompt.id, mode=mode.label, tree=mode.tree,
             budget="auto" if mode.budget == "auto" else engine.budget, budget_max=engine.budget,
             sampled=not (sp or SamplingParams()).greedy, sampling=sampling_label(sp or SamplingParams()),
             output_ids=out)
    return d


def run_checked(engine, prompt, mode: Mode, max_tokens: int, sp=None) -> dict:
    """``run_one``; a prompt the engine refuses (no chat template, over the context) ends the program clearly."""
    try:
        return run_one(engine, prompt, mode, max_tokens, sp)
    except ValueError as e:
        fail(str(e))


def run_key(r: dict) -> tuple:
    """(set, prompt_id, sampling) of a run (sampling "greedy" for runs of older JSONs without it)."""
    return r["set"], r["prompt_id"], r.get("sampling", "greedy")


def plain_outputs(runs: list[dict]) -> dict:
    """Plain decoding's output ids by ``run_key``."""
    return {run_key(r): r["output_ids"] for r in runs if r["mode"] == "plain"}


def mark_mismatches(runs: list[dict]) -> None:
    """Set each run's ``matches_plain``: its output ids equal plain decoding's on the same prompt
    (None for plain itself and when plain did not run)."""
    plain = plain_outputs(runs)
    for r in runs:
        ref = plain.get(run_key(r))
        r["matches_plain"] = None if r["mode"] == "plain" or ref is None else r["output_ids"] == ref


def classify_mismatches(engine, runs: list[dict], prompts: dict) -> None:
    """Set ``divergence`` (``tfm_local.lossless.classify`` as a dict) on every run that differs from
    plain decoding: where it starts and whether it is a numerical near-tie (the gap of the mode's
    largest verification, ``tfm_local.lossless.tie_gap``: none on the CPU for chains of at most 16
    nodes, which are batch-invariant there). ``prompts`` maps (set, prompt_id) to the
    Prompt. Each check is one prefill of the target."""
    from dataclasses import asdict

    from ..lossless import classify

    plain = plain_outputs(runs)
    for r in runs:
        if r.get("matches_plain") is False and "divergence" not in r and not r.get("sampled"):
            ids = engine.prompt_tokens(prompts[(r["set"], r["prompt_id"])].messages)
            r["divergence"] = asdict(classify(engine.target, ids, plain[run_key(r)], r["output_ids"],
                                              n_nodes=(r.get("budget_max") or 0) + 1,
                                              chain=r.get("tree") == "chain"))


def phase_ms(rows: list[dict], steps: int) -> dict:
    """Mean wall time per decode step (ms) in each phase of ``tfm_local.decode.stats.PHASES`` (drafter,
    tree, submit, verify, accept) and ``other`` (the rest of the decode time) over ``rows``; zeros without steps."""
    from ..decode.stats import PHASES

    tot = {p: sum(r["t_phases"][p] for r in rows) for p in PHASES}
    tot["other"] = sum(r["t_other_phases"] for r in rows)
    return {p: 1e3 * v / steps if steps else 0.0 for p, v in tot.items()}


def aggregate(rows: list[dict]) -> dict:
    """Totals of a set of runs: τ = emitted / verify passes, tok/s = emitted / decode time (the first
    token of each run comes from its prefill, as in ``GenerationStats.tokens_per_s``),
    mean_drafted = drafted tokens per speculative pass, n_probes / n_capture_steps / n_switches = the
    automatic budget's probes, capturing plain steps and capture switches, mismatches vs plain (None
    without plain),
    ms_per_step = the step's time split (``phase_ms``); tokens_per_s_e2e = every token generated over the
    prefills and decodes together (a captured prompt's features cost the prefill time, not the decode's)."""
    steps = sum(r["n_steps"] for r in rows)
    toks = sum(r["n_step_tokens"] for r in rows)
    gen = sum(r["n_generated"] for r in rows)
    t = sum(r["t_decode"] for r in rows)
    t_pre = sum(r.get("t_prefill", 0.0) for r in rows)
    spec = sum(r["n_spec_steps"] for r in rows)
    drafted = sum(r["n_drafted"] for r in rows)
    checked = [r["matches_plain"] for r in rows if r.get("matches_plain") is not None]
    return dict(n_prompts=len(rows), n_generated=gen, tau=toks / steps if steps else 0.0,
                tokens_per_s=toks / t if t else 0.0, t_prefill=t_pre,
                tokens_per_s_e2e=gen / (t + t_pre) if t + t_pre else 0.0, t_draft=sum(r["t_draft"] for r in rows),
                t_verify=sum(r["t_verify"] for r in rows), t_decode=t, n_steps=steps, n_spec_steps=spec,
                n_drafted=drafted, mean_drafted=drafted / spec if spec else 0.0, ms_per_step=phase_ms(rows, steps),
                **{k: sum(r.get(k, 0) for r in rows) for k in ("n_probes", "n_capture_steps", "n_switches")},
                mismatches=checked.count(False) if checked else None,
                not_near_ties=sum(1 for r in rows if r.get("divergence") and not r["divergence"]["near_tie"])
                if checked and not any(r.get("sampled") for r in rows) else None)


def summarize(runs: list[dict], set_name: str, modes: list[Mode], samplings: list[str] = ("greedy",)) -> list[dict]:
    """One summary row per sampling and mode of ``set_name``, in ``samplings`` then ``modes`` order."""
    rows = []
    for s in samplings:
        for m in modes:
            rs = [r for r in runs if r["set"] == set_name and r["mode"] == m.label and r.get("sampling", "greedy") == s]
            if rs:
                rows.append(dict(set=set_name, mode=m.label, sampling=s, tree=m.tree, budget=rs[-1]["budget"],
                                 budget_max=rs[-1]["budget_max"], **aggregate(rs)))
    return rows


def plot_path(args) -> str | None:
    """Where the PNG goes: ``--plot``, else the JSON path (or ``--plot-only``'s) with .png; None with --no-plot."""
    if args.no_plot:
        return None
    return args.plot or os.path.splitext(args.plot_only or args.json)[0] + ".png"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.plot_only:
        return replot(args)
    if args.budget is not None or args.tree is not None:
        fail("--budget and --tree do not apply to tfm-bench: give shapes and budgets in --modes (e.g. ddtree@32)")
    try:
        modes = parse_modes(args.modes)
    except ValueError as e:
        fail(str(e))
    if any(m.tree == "tfm" for m in modes) and not args.weaver:
        fail("tfm@B modes need the Weaver: --weaver WEAVER.gguf")
    if args.max_tokens < 1 or args.n_prompts < 1 or args.warmup_tokens < 0:
        fail("--max-tokens and -n must be >= 1, --warmup-tokens >= 0")
    from ..decode.sampling import SamplingParams

    try:
        kw = sampling_kwargs(args)
        seed = 0 if kw["seed"] is None else kw["seed"]
        if args.samplings is not None:
            if (kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"]) != (0.0, 0, 1.0, 0.0):
                fail("give either --samplings or --temperature/--top-k/--top-p/--min-p")
            samplings = parse_samplings(args.samplings, seed)
        else:
            sp = SamplingParams(**{**kw, "seed": seed})
            samplings = [Sampling(sampling_label(sp), sp)]
    except ValueError as e:
        fail(str(e))
    sp = samplings[0].sp
    check_writable(args.json, "--json")
    png = plot_path(args)
    if png:
        check_writable(png, "--plot")
    from ..files.datasets import load_prompt_set

    try:
        sets = {name: load_prompt_set(name, args.n_prompts) for name in args.sets.split(",")}
    except (ValueError, OSError, LookupError) as e:
        fail(str(e))
    spec = [m.label for m in modes if m.budget != 0]
    if spec and args.no_draft:
        fail(f"mode(s) {', '.join(spec)} need a drafter; drop --no-draft or use --modes plain")
    # with the Weaver and a DARTree mode, the engine places the Weaver where a DARTree builds fastest
    # (``Engine.weaver_ms``), else where a TfM tree does
    dartree = args.weaver and any(m.tree == "dartree" for m in modes)
    args.tree, args.budget = "dartree" if dartree else "chain", (None if spec else 0)
    # every mode prefills its prompt cold (no prompt cache): plain and speculative decoding then start
    # from the same cache bits (a warm prefill of a prompt's last tokens rounds otherwise) and pay the
    # same prefill, which the end-to-end speed counts
    args.no_prompt_cache = True
    engine = engine_from_args(args)
    if spec and engine.drafter is None:
        fail(f"mode(s) {', '.join(spec)} need a drafter, and none was loaded")
    for m in modes:  # a shape this drafter cannot draw (lattice@B without a DFlash2 drafter) before any run
        try:
            engine.set_draft(m.tree, m.budget)
        except ValueError as e:
            fail(f"mode {m.label}: {e}")
    runs, table = [], []
    first = next((ps[0] for ps in sets.values() if ps), None)
    if first is not None and args.warmup_tokens:
        for s in samplings:  # the first passes of each shape (and sampler) allocate buffers: untimed
            for mode in modes:
                run_checked(engine, first, mode, args.warmup_tokens, s.sp)
    for k, (name, prompts) in enumerate(sets.items()):
        for i, p in enumerate(prompts):
            runs += [dict(run_checked(engine, p, m, args.max_tokens, s.sp), set=name)
                     for s in samplings for m in mode_order(modes, i)]
            print(f"\r{name}: {i + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        mark_mismatches(runs)
        if any(s.sp.greedy for s in samplings):  # the near-tie rule is about argmax picks
            classify_mismatches(engine, runs, {(name, p.id): p for p in prompts})
        table += summarize(runs, name, modes, [s.label for s in samplings])
        if k + 1 < len(sets):  # sets still to run: keep the finished ones on disk
            write_json(args, table, runs, engine, argv, sets_done=list(sets)[:k + 1], samplings=samplings)
    print_table(table)
    bad = [f"{r['set']}/{r['prompt_id']} {r['mode']}" for r in runs
           if r.get("divergence") and not r["divergence"]["near_tie"]]
    if bad:
        print(f"warning: {len(bad)} output(s) differ from plain decoding without a near-tie: "
              + ", ".join(bad), file=sys.stderr)
    write_json(args, table, runs, engine, argv, samplings=samplings)
    engine.close()
    if png:
        draw_or_warn([r for r in table if r.get("sampling", "greedy") == samplings[0].label], png)


def replot(args) -> None:
    """``--plot-only JSON``: redraw the plot of an existing bench JSON."""
    try:
        with open(args.plot_only) as f:
            table = json.load(f)["summary"]
    except KeyError:
        fail(f"{args.plot_only} is not a tfm-bench JSON (it has no 'summary')")
    except (OSError, ValueError, TypeError) as e:
        fail(f"cannot read a bench JSON from {args.plot_only}: {e}")
    png = plot_path(args)
    if png is None:
        fail("--plot-only with --no-plot draws nothing")
    check_writable(png, "--plot")
    try:
        draw_plot(table, png)
    except ImportError:
        fail("--plot-only needs matplotlib (pip install matplotlib)")
    print(f"wrote {png}", file=sys.stderr)


def add_speedups(table: list[dict]) -> None:
    """Set each row's ``speedup``: its tokens/s over plain decoding's on the same set with the same sampling,
    and ``vs_greedy``: over plain greedy decoding's on the same set (None without such a plain row)."""
    plain = {(r["set"], r.get("sampling", "greedy")): r for r in table if r["mode"] == "plain"}
    for r in table:
        p, g = plain.get((r["set"], r.get("sampling", "greedy")), {}), plain.get((r["set"], "greedy"), {})
        b, b2, bg = p.get("tokens_per_s"), p.get("tokens_per_s_e2e"), g.get("tokens_per_s")
        r["speedup"] = r["tokens_per_s"] / b if b else None
        r["speedup_e2e"] = r["tokens_per_s_e2e"] / b2 if b2 and r.get("tokens_per_s_e2e") else None
        r["vs_greedy"] = r["tokens_per_s"] / bg if bg else None


def print_table(table: list[dict]) -> None:
    """Print the summary table (after ``add_speedups``, so the JSON gets them too);
    ``-`` for a speed-up without plain and for mismatches not checked."""
    add_speedups(table)
    for r in table:
        r["label"] = r["mode"] if r.get("sampling", "greedy") == "greedy" else f"{r['mode']} {r['sampling']}"
    w = max([len("mode")] + [len(r["label"]) for r in table])
    print(f"{'set':<10} {'mode':<{w}} {'budget':>6} {'prompts':>7} {'tokens':>7} {'tau':>6} {'tok/s':>7} "
          f"{'speedup':>8} {'e2e':>6} {'x greedy':>8} {'mismatches (not ties)':>21}")
    for r in table:
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        vg = "-" if r.get("vs_greedy") is None else f"{r['vs_greedy']:.2f}x"
        e2 = "-" if r.get("speedup_e2e") is None else f"{r['speedup_e2e']:.2f}x"
        ties = "-" if r["not_near_ties"] is None else r["not_near_ties"]
        mm = "-" if r["mismatches"] is None else f"{r['mismatches']} ({ties})"
        print(f"{r['set']:<10} {r['label']:<{w}} {r['budget']!s:>6} {r['n_prompts']:>7} {r['n_generated']:>7} "
              f"{r['tau']:>6.2f} {r['tokens_per_s']:>7.1f} {sp:>8} {e2:>6} {vg:>8} {mm:>21}")
    print_phases(table, w)


def print_phases(table: list[dict], w: int) -> None:
    """Second table: ms per decode step in each phase (drafter = injection + drafting pass, tree =
    building the draft, submit = the target's batch and decode call, verify = waiting for the target
    pass + reading its results, accept = walk + KV commit); a phase missing from an older JSON is 0."""
    from ..decode.stats import PHASES

    cols = (*PHASES, "other")
    print(f"\n{'ms per step':<{11 + w}} " + " ".join(f"{c:>8}" for c in cols) + f" {'total':>8}")
    for r in table:
        ms = r["ms_per_step"]
        print(f"{r['set']:<10} {r.get('label', r['mode']):<{w}} " + " ".join(f"{ms.get(c, 0.0):>8.2f}" for c in cols)
              + f" {sum(ms.values()):>8.2f}")


def machine_info(args, engine) -> dict:
    """Platform, CPU count, decoding threads and whether the models run on a GPU."""
    from ..llama.model import default_threads, gpu_available

    return dict(platform=platform.platform(), cpus=os.cpu_count(), threads=args.threads or default_threads(),
                gpu=bool(gpu_available() and not args.cpu))


def vocab_file(args) -> str | None:
    """The ``--draft-vocab`` .npy file, if one was given (not 'auto' or 'full')."""
    v = getattr(args, "draft_vocab", "auto")
    return None if v in ("auto", "full") else v


def write_json(args, table, runs, engine, argv=None, sets_done: list[str] | None = None, samplings=()) -> None:
    """Write the bench JSON atomically: command, date, machine, models, sampling (the first setting's
    parameters, None = greedy), samplings (every setting: label and parameters), summary rows,
    per-prompt runs, where it ran and on which files (``provenance``), and with a Weaver the ms of a TfM
    tree (a DARTree when a mode is dartree@B) on each device timed at load (``weaver_ms``,
    ``Engine.weaver_ms``: the faster device runs it).
    With ``sets_done`` (after each prompt set but the last) the file is marked ``"complete": false`` and
    lists the finished sets, so that an interrupted run keeps them."""
    doc = dict(**run_record(argv), machine=machine_info(args, engine),
               target=str(engine.target.model.path), drafter=str(engine.drafter.model.path) if engine.drafter
               else None, max_tokens=args.max_tokens, n_prompts=args.n_prompts, modes=args.modes,
               sampling=None if not samplings or samplings[0].sp.greedy else dataclasses.asdict(samplings[0].sp),
               samplings=[dict(label=s.label, **dataclasses.asdict(s.sp)) for s in samplings],
               complete=sets_done is None, summary=table, runs=runs, written=time.time(),
               provenance=provenance(dict(target=engine.target.model.path,
                                          drafter=engine.drafter.model.path if engine.drafter else None,
                                          weaver=getattr(args, "weaver", None), draft_vocab=vocab_file(args))))
    if getattr(engine, "weaver_ms", None):
        doc["weaver_ms"] = dict(engine.weaver_ms)
    if sets_done is not None:
        doc["sets_done"] = sets_done
    write_common_json(args.json, doc)
    if sets_done is None:
        print(f"wrote {args.json}", file=sys.stderr)


def draw_or_warn(table: list[dict], path: str) -> None:
    """Draw the plot; without matplotlib print a one-line warning instead."""
    try:
        draw_plot(table, path)
    except ImportError:
        print(f"{program_name('tfm-bench')}: warning: matplotlib is not installed, no plot written ({path})", file=sys.stderr)
        return
    print(f"wrote {path}", file=sys.stderr)


def draw_plot(table: list[dict], path: str) -> None:
    """PNG with one row per prompt set: τ vs B and tok/s vs B (log2 x-axis).

    Modes ``SHAPE@B`` with an integer budget are curves (one per shape, at the budget used);
    the others (plain, chain, auto, ``SHAPE@auto``) are horizontal reference lines.
    Raises ImportError when matplotlib is missing.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sets = list(dict.fromkeys(r["set"] for r in table))
    fig = Figure(figsize=(11, 3.6 * max(len(sets), 1)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(len(sets), 1), 2, squeeze=False)
    for (ax_tau, ax_tps), name in zip(axes, sets):
        rows = [r for r in table if r["set"] == name]
        for ax, key, ylabel in ((ax_tau, "tau", "τ (tokens per target pass)"), (ax_tps, "tokens_per_s", "tokens/s")):
            draw_panel(ax, rows, key)
            ax.set(title=f"{name}: {ylabel.split(' (')[0]} vs budget", xlabel="budget B (draft tokens / nodes)",
                   ylabel=ylabel)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
    from ..files.atomic import atomic_output

    with atomic_output(path) as tmp:  # as the JSON: a failed or interrupted write leaves any earlier plot whole
        fig.savefig(tmp, dpi=100, format="png")


def is_curve(row: dict) -> bool:
    """A ``SHAPE@B`` row with an integer budget (a point on its shape's curve)."""
    return "@" in row["mode"] and isinstance(row.get("budget"), int)


def ref_label(row: dict) -> str:
    """Legend label of a reference line: the mode, with the budget used when the label lacks it."""
    b = row.get("budget")
    return row["mode"] if row["mode"] == "plain" or not isinstance(b, int) else f"{row['mode']} (B={b})"


def draw_panel(ax, rows: list[dict], key: str) -> None:
    """One panel: a curve of ``key`` vs B per shape, horizontal lines for the other modes."""
    from matplotlib.ticker import ScalarFormatter

    colors = (f"C{i}" for i in range(100))
    styles = ["--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1))]
    for shape in dict.fromkeys(r["tree"] for r in rows if is_curve(r)):
        pts = sorted((r["budget"], r[key]) for r in rows if is_curve(r) and r["tree"] == shape)
        ax.plot([b for b, _ in pts], [v for _, v in pts], "o-", color=next(colors), label=f"{shape}@B")
    if any(is_curve(r) for r in rows):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 16, not 2^4
    refs = [r for r in rows if not is_curve(r)]
    for i, r in enumerate(refs):
        ax.axhline(r[key], linestyle=styles[i % len(styles)],
                   color="black" if r["mode"] == "plain" else next(colors), label=ref_label(r))


if __name__ == "__main__":
    main()
