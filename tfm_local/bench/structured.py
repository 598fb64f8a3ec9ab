"""tfm-bench structured: plain against speculative decoding under a grammar (JSON schema answers, forced
tool calls), side by side per prompt: tokens/s, τ, outputs equal, outputs valid.

Two kinds of constrained request, ``--n`` prompts each:

* **json_schema**: a GSM8K or HumanEval question asking for a JSON answer, constrained by a small schema
  per set (``SCHEMAS``), as ``response_format: json_schema`` is served;
* **tool call**: a user request for one of three tools (``TOOLS``), the tools rendered by the target's
  template and the call forced by ``tool_choice: "required"`` (``server.tool_calls.forced_call_grammar``).

Each prompt runs plain decoding (budget 0) and the speculative mode (``--budget``, default auto) of one
engine back to back, in an order alternating per prompt, greedy and sampled (``--temperature`` with a
seed per prompt). Speculative output must equal plain constrained output: on the CPU every greedy
difference is a bug (chains of at most 16 nodes are exact: ``tfm_local.lossless``); sampled runs with
one seed draw the same tokens wherever the logits agree. Prints a table, writes JSON (``--json``, with
the provenance record); exits 1 when an output differs or a finished output does not parse.

    tfm-bench structured --json structured.json
"""
from __future__ import annotations

import argparse
import json
import sys

from ..cli.common import add_engine_args, check_writable, engine_from_args, fail, positive_int, run_record
from ..cli.program import program_name
from .provenance import provenance

#: the answer schema per prompt set (short fields: a greedy answer ends well inside --max-tokens)
SCHEMAS = {
    "gsm8k": {"type": "object", "properties": {"answer": {"type": "number"}, "unit": {"type": "string"},
                                                "confident": {"type": "boolean"}},
              "required": ["answer", "unit", "confident"], "additionalProperties": False},
    "humaneval": {"type": "object", "properties": {"function_name": {"type": "string"},
                                                    "arguments": {"type": "array", "items": {"type": "string"}},
                                                    "returns": {"type": "string"}},
                  "required": ["function_name", "arguments", "returns"], "additionalProperties": False},
}
INSTRUCTION = "Answer only with a JSON object with the fields {fields}."

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "search_code", "description": "Search a code base.",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"},
                                          "language": {"type": "string", "enum": ["python", "c", "rust"]}},
                                          "required": ["query", "language"]}}},
    {"type": "function", "function": {"name": "calculate", "description": "Evaluate an arithmetic expression.",
                                      "parameters": {"type": "object", "properties": {
                                          "expression": {"type": "string"}}, "required": ["expression"]}}},
]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Hanoi", "Dakar"]
TOOL_REQUESTS = ["Is it raining in {city} right now? Use celsius.",
                 "Find where our Python code opens a socket to {city}'s weather service.",
                 "What is 17 * 23 + {n}?",
                 "How warm is it in {city} in fahrenheit?"]


def json_tasks(n: int) -> list[dict]:
    """``n`` json_schema requests, GSM8K and HumanEval questions in turn: messages and schema."""
    from ..files.datasets import load_prompt_set

    sets = {name: load_prompt_set(name, n) for name in SCHEMAS}
    out = []
    for i in range(n):
        name = list(SCHEMAS)[i % len(SCHEMAS)]
        schema = SCHEMAS[name]
        ask = INSTRUCTION.format(fields=", ".join(schema["properties"]))
        out.append(dict(kind="json_schema", set=name, schema=schema,
                        messages=[{"role": "user", "content": f"{sets[name][i // len(SCHEMAS)].text}\n\n{ask}"}]))
    return out


def tool_tasks(n: int) -> list[dict]:
    """``n`` forced tool-call requests."""
    return [dict(kind="tool_call", set="tools", tools=TOOLS, messages=[{"role": "user", "content": TOOL_REQUESTS[
        i % len(TOOL_REQUESTS)].format(city=CITIES[i % len(CITIES)], n=i)}]) for i in range(n)]


def task_grammar(task: dict) -> str:
    """The task's GBNF: its schema's, or any one of its tools called (``forced_call_grammar``)."""
    from ..decode.grammar import json_grammar

    if task["kind"] == "json_schema":
        return json_grammar(task["schema"])
    from ..server.tool_calls import forced_call_grammar

    return forced_call_grammar(task["tools"], None)


def valid(task: dict, text: str) -> bool:
    """Whether a finished output is what its task asked for: JSON with the schema's fields, or one tool
    call naming a listed tool with JSON arguments."""
    if task["kind"] == "json_schema":
        try:
            obj = json.loads(text)
        except ValueError:
            return False
        return isinstance(obj, dict) and set(obj) == set(task["schema"]["properties"])
    from ..server.tool_calls import parse_tool_calls

    names = frozenset(t["function"]["name"] for t in task["tools"])
    content, calls = parse_tool_calls(text, names)
    return content is None and len(calls) == 1 and calls[0].name in names \
        and isinstance(json.loads(calls[0].arguments), dict)


def run_one(engine, ids: list[int], max_tokens: int, sp, budget) -> dict:
    """One generation with ``budget`` (0 = plain): its tokens, tokens/s, τ and finish."""
    engine.set_budget(budget)
    out = list(engine.generate_ids(ids, max_tokens, sp))
    st = engine.stats
    return dict(ids=out, tokens_per_s=st.tokens_per_s, tau=st.tau, n=len(out), finish=st.finish_reason,
                t_decode=st.t_total - st.t_prefill)


def summarise(rows: list[dict]) -> list[dict]:
    """Per (kind, sampling): tokens and decode seconds summed over prompts, tokens/s of each mode, the
    speed-up, the speculative τ, equal and valid outputs."""
    out = []
    for key in dict.fromkeys((r["kind"], r["sampling"]) for r in rows):
        sel = [r for r in rows if (r["kind"], r["sampling"]) == key]
        agg = {}
        for mode in ("plain", "spec"):
            n = sum(r[mode]["n"] - 1 for r in sel)  # the prefill's first token is not a decode step's
            t = sum(r[mode]["t_decode"] for r in sel)
            agg[mode] = n / t if t > 0 else 0.0
        steps = sum((r["spec"]["n"] - 1) / r["spec"]["tau"] for r in sel if r["spec"]["tau"] > 0)
        out.append(dict(kind=key[0], sampling=key[1], n=len(sel), plain_tok_s=agg["plain"], spec_tok_s=agg["spec"],
                        speedup=agg["spec"] / agg["plain"] if agg["plain"] else 0.0,
                        tau=sum(r["spec"]["n"] - 1 for r in sel) / steps if steps else 0.0,
                        equal=sum(r["equal"] for r in sel), valid=sum(r["valid"] for r in sel),
                        finished=sum(r["plain"]["finish"] == "stop" for r in sel)))
    return out


def table(summary: list[dict]) -> str:
    lines = [f"{'kind':12} {'sampling':9} {'n':>3} {'plain tok/s':>11} {'spec tok/s':>10} {'speed-up':>8} "
             f"{'tau':>5} {'equal':>6} {'valid':>6}"]
    for s in summary:
        lines.append(f"{s['kind']:12} {s['sampling']:9} {s['n']:3d} {s['plain_tok_s']:11.2f} {s['spec_tok_s']:10.2f} "
                     f"{s['speedup']:7.2f}x {s['tau']:5.2f} {s['equal']:3d}/{s['n']:<2d} "
                     f"{s['valid']:3d}/{s['finished']:<2d}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench structured"), description=__doc__.split("\n\n")[0])
    add_engine_args(ap)
    ap.add_argument("-n", type=positive_int, default=20, help="prompts per kind (default 20)")
    ap.add_argument("--kinds", default="json_schema,tool_call", help="json_schema, tool_call or both (default)")
    ap.add_argument("--max-tokens", type=positive_int, default=128, help="tokens per generation (default 128)")
    ap.add_argument("--temperature", type=float, default=0.7, help="the sampled runs' temperature (default 0.7)")
    ap.add_argument("--top-p", type=float, default=0.95, help="the sampled runs' top-p (default 0.95)")
    ap.add_argument("--json", metavar="PATH", help="write the results here")
    args = ap.parse_args(argv)
    kinds = args.kinds.split(",")
    if not kinds or set(kinds) - {"json_schema", "tool_call"}:
        fail(f"--kinds takes json_schema and/or tool_call, got {args.kinds!r}")
    if args.no_draft or args.budget == 0:
        fail("tfm-bench structured compares plain with speculative decoding: leave out --no-draft / --budget 0")
    if args.json:
        check_writable(args.json, "--json")
    from ..decode.sampling import SamplingParams

    head = run_record(argv)
    try:
        tasks = (json_tasks(args.n) if "json_schema" in kinds else []) + (tool_tasks(args.n) if "tool_call" in kinds
                                                                           else [])
    except (ValueError, LookupError) as e:
        fail(str(e))
    engine = engine_from_args(args)
    files = {"target": engine.target.model.path, "drafter": engine.drafter.model.path if engine.drafter else None}
    rows = []
    try:
        for i, task in enumerate(tasks):
            gbnf = task_grammar(task)
            ids = engine.prompt_tokens(task["messages"], tools=task.get("tools"))
            for label, sp in (("greedy", SamplingParams(grammar=gbnf)),
                              (f"t={args.temperature:g}", SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                                                        seed=i, grammar=gbnf))):
                order = ("plain", "spec") if i % 2 == 0 else ("spec", "plain")
                res = {m: run_one(engine, ids, args.max_tokens, sp, 0 if m == "plain" else args.budget)
                       for m in order}
                text = engine.tok.decode([t for t in res["plain"]["ids"] if not engine.tok.is_eog(t)])
                row = dict(kind=task["kind"], set=task["set"], prompt=i, sampling=label,
                           equal=res["plain"]["ids"] == res["spec"]["ids"],
                           valid=res["plain"]["finish"] == "stop" and valid(task, text), text=text,
                           **{m: {k: v for k, v in r.items() if k != "ids"} for m, r in res.items()})
                rows.append(row)
                print(f"{task['kind']:11} {i:3d} {label:8} plain {res['plain']['tokens_per_s']:6.2f} tok/s, spec "
                      f"{res['spec']['tokens_per_s']:6.2f} tok/s tau {res['spec']['tau']:.2f} "
                      f"{'equal' if row['equal'] else 'DIFFERENT'}{'' if row['valid'] else ' (not valid)'}",
                      flush=True)
    except (ValueError, LookupError, OSError, RuntimeError) as e:
        fail(str(e))
    finally:
        engine.close()
    summary = summarise(rows)
    print(table(summary))
    ok = all(r["equal"] for r in rows) and all(r["valid"] or r["plain"]["finish"] != "stop" for r in rows)
    if args.json:
        from ..files.atomic import write_json

        write_json(args.json, dict(**head, budget=args.budget, tree=args.tree, max_tokens=args.max_tokens,
                                   summary=summary, rows=rows, provenance=provenance(files)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
