"""tfm-bench project: the speed-up a target would get, from the step costs measured on one pair and the
acceptance measured on another.

A random-weight twin (``tfm-bench twin``) has the shape and tensor types of a large target, so its passes
cost what the real model's would, but its drafts are never accepted (τ = 1). A real pair gives τ but not
the large target's costs. This command joins the two tfm-bench JSONs: for each set and fixed-budget mode
of the τ source, the projected speed-up over plain decoding is

    τ · c_plain / c_step

with ``c_plain`` and ``c_step`` the cost source's milliseconds per step (every phase, ``ms_per_step``) of
plain decoding and of that mode, taken from the same set when the cost source has it, else averaged over
its sets. It is printed as a projection, naming both sources. What it leaves out: on a twin a step
commits and injects one token, so the accept and drafter phases of a step that accepts τ tokens are a
little dearer than measured; and a real target's acceptance need not equal the pair's that gave τ.

    tfm-bench project --costs twin-bench.json --tau real-bench.json [--json projection.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..cli.program import alias_note, program_name


def _load(path: str) -> dict:
    """A tfm-bench JSON (its ``summary`` rows); SystemExit with the reason when it is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{program_name('tfm-bench-project')}: cannot read {path}: {e}")
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), list):
        raise SystemExit(f"{program_name('tfm-bench-project')}: {path} is not a tfm-bench JSON (no 'summary' list)")
    return doc


def _fixed(row: dict) -> bool:
    """A row of plain decoding or of a fixed budget (an automatic budget's costs follow its own choices)."""
    return isinstance(row.get("budget"), int) and row.get("budget") == row.get("budget_max", row.get("budget"))


def step_ms(row: dict) -> float:
    """Milliseconds of one step of a summary row: the sum of its phases (``ms_per_step``)."""
    return float(sum(row["ms_per_step"].values()))


def project(costs: dict, tau: dict, sampling: str = "greedy") -> list[dict]:
    """Projected speed-ups: one dict per (set, mode) of ``tau``'s fixed-budget rows with ``sampling``
    whose mode the cost source measured too (and plain decoding with it). Keys: set, mode, tau (the τ
    source's), step_ms and plain_ms (the cost source's), cost_set (the cost source's set used, or "mean"),
    projected (τ · plain_ms / step_ms), measured (the τ source's own speed-up, for comparison)."""
    def rows(doc):
        return [r for r in doc["summary"] if r.get("sampling", "greedy") == sampling and _fixed(r)]

    by_mode: dict[str, dict[str, dict]] = {}
    for r in rows(costs):
        by_mode.setdefault(r["label"], {})[r["set"]] = r

    def cost(label: str, name: str) -> tuple[float, str] | None:
        sets = by_mode.get(label)
        if not sets:
            return None
        if name in sets:
            return step_ms(sets[name]), name
        return sum(step_ms(r) for r in sets.values()) / len(sets), "mean"

    plain_label = next((r["label"] for r in rows(costs) if r["budget"] == 0), None)
    out = []
    for r in rows(tau):
        if r["budget"] == 0 or plain_label is None:
            continue
        step, plain = cost(r["label"], r["set"]), cost(plain_label, r["set"])
        if step is None or plain is None:
            continue
        out.append(dict(set=r["set"], mode=r["label"], tau=round(float(r["tau"]), 3), step_ms=round(step[0], 3),
                        plain_ms=round(plain[0], 3), cost_set=step[1],
                        projected=round(float(r["tau"]) * plain[0] / step[0], 3),
                        measured=round(float(r.get("speedup", float("nan"))), 3)))
    return out


def _source(doc: dict, path: str) -> str:
    m = doc.get("machine") or {}
    where = "GPU" if m.get("gpu") else f"CPU, {m.get('threads', '?')} threads"
    return f"{path}: target {doc.get('target')}, drafter {doc.get('drafter')}, {where}, {doc.get('date')}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-project"), description=__doc__.split("\n\n")[0],
                                 epilog=alias_note("tfm-bench project"))
    ap.add_argument("--costs", required=True, help="tfm-bench JSON whose step costs to use (e.g. a twin's)")
    ap.add_argument("--tau", required=True, help="tfm-bench JSON whose τ to use (a real pair's)")
    ap.add_argument("--sampling", default="greedy", help="the rows' sampling label (default greedy)")
    ap.add_argument("--json", default=None, help="write the projection here")
    args = ap.parse_args(argv)
    costs, tau = _load(args.costs), _load(args.tau)
    rows = project(costs, tau, args.sampling)
    if not rows:
        print(f"{program_name('tfm-bench-project')}: no fixed-budget mode of the τ source was measured in the "
              "cost source (with plain decoding)", file=sys.stderr)
        return 1
    print("PROJECTION (not a measurement)")
    print(f"  costs from {_source(costs, args.costs)}")
    print(f"  τ from     {_source(tau, args.tau)}")
    print(f"{'set':10s} {'mode':14s} {'tau':>6s} {'step ms':>8s} {'plain ms':>9s} {'projected':>10s} {'tau src':>8s}")
    for r in rows:
        print(f"{r['set']:10s} {r['mode']:14s} {r['tau']:6.2f} {r['step_ms']:8.2f} {r['plain_ms']:9.2f} "
              f"{r['projected']:9.2f}x {r['measured']:7.2f}x" + ("" if r["cost_set"] != "mean" else "  (costs: mean of sets)"))
    print("projected = tau x plain ms / step ms; 'tau src' = the τ source's own measured speed-up")
    from .provenance import problems, provenance

    for name, path, doc in (("costs", args.costs, costs), ("τ", args.tau, tau)):
        lacks = problems(doc.get("provenance"))
        if lacks:
            print(f"{program_name('tfm-bench-project')}: warning: the {name} source {path} cannot say where it ran "
                  f"({'; '.join(lacks[:3])})", file=sys.stderr)
    if args.json:
        from ..files.atomic import write_json

        # this run's provenance (its input files hashed) and the sources' own, where they ran
        write_json(args.json, dict(kind="projection", date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                   costs=args.costs, tau=args.tau, sampling=args.sampling, rows=rows,
                                   sources={"costs": costs.get("provenance"), "tau": tau.get("provenance")},
                                   provenance=provenance({"costs": args.costs, "tau": args.tau})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
