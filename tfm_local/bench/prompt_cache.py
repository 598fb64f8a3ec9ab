"""tfm-bench cache: what the prompt cache saves on a follow-up chat turn and a repeated API request.

A conversation is built as a chat user builds one: user turns from the prompt sets (MT-Bench,
HumanEval, GSM8K in turn), each answered by the engine (greedy, ``--answer-tokens``), until the next
prompt reaches ``--conversation-tokens``. Then, for each sampling (greedy, and T = ``--temperature``
with ``--seed``): the last question is answered again (the cache then holds the conversation, as
after a chat turn), a follow-up question is sent with the prompt cache (warm), and the same prompt
once more with the cache forgotten (cold, a prefill from position 0). Per run: prompt tokens,
tokens prefilled, tokens kept (``GenerationStats.n_cached``), time to first token (wall time until
the first token is out) and the ``--followup-tokens`` output; warm and cold outputs must be equal.
Where the target's small passes are exact (the CPU: ``exact_cache``) every cell of the cache has the
same bits however it was computed, and any difference fails; elsewhere (a GPU, trees) a greedy
divergence may start at a numerical near-tie (``tfm_local.lossless``: the kept cells were computed in
other batch shapes than a cold prefill's), as the project's lossless checks accept. Last, the
follow-up is sent twice through tfm-serve's app (in process, its HTTP routes), and the second
answer's ``usage.prompt_tokens_details.cached_tokens`` is read.

The bar (docs/prompt-cache.md): warm prefill <= 10% of cold's tokens, warm TTFT <= 15% of cold's,
a repeated request >= 95% of its prompt tokens cached, outputs equal (or, where the cache is not exact, a
greedy near-tie). Prints a table, writes JSON
(``--json``, with the provenance record); exits 1 when a bar is missed.

    tfm-bench cache --json cache.json
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time

from ..cli.program import program_name
from ..cli.common import add_engine_args, check_writable, engine_from_args, fail, positive_int, run_record
from .provenance import provenance

#: the bar of the prompt cache (issue text, docs/prompt-cache.md)
MAX_PREFILL_RATIO = 0.10
MAX_TTFT_RATIO = 0.15
MIN_CACHED_RATIO = 0.95

FOLLOWUP = "Thank you. Now summarise your last answer in two sentences."


def timed_generation(engine, messages: list[dict], max_tokens: int, sp) -> dict:
    """One generation of ``messages``: its output ids, time to first token and the prompt counts."""
    ids = engine.prompt_tokens(messages)
    t0 = time.perf_counter()
    it = engine.generate_ids(ids, max_tokens, sp)
    out = [next(it)]
    ttft = time.perf_counter() - t0
    out += list(it)
    st = engine.stats
    return dict(prompt_ids=ids, output_ids=out, n_prompt=st.n_prompt, n_cached=st.n_cached,
                n_prefilled=st.n_prefilled, ttft_s=ttft, t_prefill_s=st.t_prefill, finish_reason=st.finish_reason)


def user_turns(sets: list[str]):
    """User messages from the prompt sets, one of each set in turn, endlessly (ValueError/LookupError
    from ``load_prompt_set``)."""
    from ..files.datasets import load_prompt_set

    loaded = [load_prompt_set(name) for name in sets]
    for group in itertools.cycle(itertools.zip_longest(*loaded)):
        for p in group:
            if p is not None:
                yield p.text


def build_conversation(engine, sets: list[str], n_tokens: int, answer_tokens: int, log=print) -> list[dict]:
    """Messages ending with a user turn whose prompt holds at least ``n_tokens`` tokens, every earlier user
    turn answered by ``engine`` (greedy, at most ``answer_tokens`` each, the prompt cache as it is set).
    Raises ValueError when even one turn does not fit the context."""
    from ..decode.sampling import SamplingParams

    turns = user_turns(sets)
    messages = [{"role": "user", "content": next(turns)}]
    while len(engine.prompt_tokens(messages)) < n_tokens:
        r = timed_generation(engine, messages, answer_tokens, SamplingParams())
        answer = engine.tok.decode([t for t in r["output_ids"] if not engine.tok.is_eog(t)])
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": next(turns)}]
        log(f"  turn {len(messages) // 2}: prompt {r['n_prompt']} tokens ({r['n_cached']} cached), "
            f"answer {len(r['output_ids'])} tokens")
    engine.target.check_fits(len(engine.prompt_tokens(messages)) + answer_tokens)
    return messages


def follow_up(engine, messages: list[dict], answer_tokens: int, followup_tokens: int, sp) -> dict:
    """Answer the last user turn of ``messages`` (greedy), then send a follow-up question warm (the cache
    holds the conversation) and cold (cache forgotten) with sampling ``sp``; both runs and the comparison."""
    from ..decode.sampling import SamplingParams
    from ..lossless import classify

    r = timed_generation(engine, messages, answer_tokens, SamplingParams())
    answer = engine.tok.decode([t for t in r["output_ids"] if not engine.tok.is_eog(t)])
    conv = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOWUP}]
    warm = timed_generation(engine, conv, followup_tokens, sp)
    engine.prompt_cache.forget()
    cold = timed_generation(engine, conv, followup_tokens, sp)
    equal = warm["output_ids"] == cold["output_ids"]
    near_tie, divergence = None, None
    exact = exact_cache(engine)
    if not equal and sp.greedy:
        d = classify(engine.target, cold["prompt_ids"], cold["output_ids"], warm["output_ids"])
        near_tie = bool(d is not None and d.near_tie) and not exact  # exact: any difference is a bug
        divergence = None if d is None else dict(index=d.index, cold_token=d.ref_token, warm_token=d.out_token,
                                                 gaps=d.gaps, near_tie=d.near_tie)
    for x in (warm, cold):
        del x["prompt_ids"]
    return dict(conversation=conv, answered=dict(n_prompt=r["n_prompt"], n_answer=len(r["output_ids"])),
                warm=warm, cold=cold, exact=exact, equal=equal, near_tie=near_tie, divergence=divergence,
                prefill_ratio=warm["n_prefilled"] / cold["n_prefilled"], ttft_ratio=warm["ttft_s"] / cold["ttft_s"])


def exact_cache(engine) -> bool:
    """Whether a warm cache must hold a cold prefill's bits (no near-tie excuses a greedy difference): the
    target prefills in exact small passes (``Target.prefill_rows``, ``lossless.small_batch_exact``) and
    verifies chains of at most that many nodes (a tree's commit leaves its cells out of position order)."""
    from ..lossless import SMALL_BATCH_ROWS, small_batch_exact

    t = engine.target
    return (small_batch_exact(t.model) and t.prefill_rows <= SMALL_BATCH_ROWS
            and (engine.active_drafter is None or engine.tree_mode == "chain"))


def repeated_request(engine, model_name: str, messages: list[dict], max_tokens: int) -> dict:
    """``messages`` sent twice to tfm-serve's chat route (the app in process: ``create_app``, Starlette's
    test client), greedy; the second answer's usage. Closes ``engine`` (the app's shutdown does)."""
    from fastapi.testclient import TestClient

    from ..server import create_app

    body = {"model": model_name, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    with TestClient(create_app(engine, model_name)) as client:
        first, second = (client.post("/v1/chat/completions", json=body) for _ in range(2))
    for r in (first, second):
        if r.status_code != 200:
            raise RuntimeError(f"the server answered {r.status_code}: {r.text[:300]}")
    u1, u2 = first.json()["usage"], second.json()["usage"]
    cached = u2["prompt_tokens_details"]["cached_tokens"]
    return dict(prompt_tokens=u2["prompt_tokens"], cached_tokens=cached,
                first_cached_tokens=u1["prompt_tokens_details"]["cached_tokens"],
                cached_ratio=cached / u2["prompt_tokens"],
                equal=first.json()["choices"][0]["message"] == second.json()["choices"][0]["message"],
                prefill_s=[u1["tfm"]["prefill_s"], u2["tfm"]["prefill_s"]])


def bar(runs: list[dict], repeat: dict | None) -> dict:
    """Each bar's verdict (True = met) over the follow-up ``runs`` and the ``repeat`` request."""
    out = {"prefill_ratio": all(r["prefill_ratio"] <= MAX_PREFILL_RATIO for r in runs),
           "ttft_ratio": all(r["ttft_ratio"] <= MAX_TTFT_RATIO for r in runs),
           "outputs_equal": all(r["equal"] or r["near_tie"] for r in runs)}
    if repeat is not None:
        out["repeat_cached_ratio"] = repeat["cached_ratio"] >= MIN_CACHED_RATIO
    return out


def table(runs: list[dict], repeat: dict | None) -> str:
    """The runs as text lines."""
    lines = [f"{'sampling':10} {'prompt':>6} {'cold pf':>7} {'warm pf':>7} {'cached':>6} {'pf %':>6} "
             f"{'cold ttft':>9} {'warm ttft':>9} {'ttft %':>6}  equal"]
    for r in runs:
        w, c = r["warm"], r["cold"]
        eq = "yes" if r["equal"] else ("near-tie" if r["near_tie"] else "NO")
        lines.append(f"{r['sampling']:10} {w['n_prompt']:6d} {c['n_prefilled']:7d} {w['n_prefilled']:7d} "
                     f"{w['n_cached']:6d} {100 * r['prefill_ratio']:5.1f}% {c['ttft_s']:8.2f}s {w['ttft_s']:8.2f}s "
                     f"{100 * r['ttft_ratio']:5.1f}%  {eq}")
    if repeat is not None:
        lines.append(f"repeated server request: {repeat['cached_tokens']} of {repeat['prompt_tokens']} prompt "
                     f"tokens cached ({100 * repeat['cached_ratio']:.1f}%), prefill {repeat['prefill_s'][0]:.2f}s "
                     f"then {repeat['prefill_s'][1]:.2f}s, answers equal: {repeat['equal']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench cache"), description=__doc__.split("\n\n")[0])
    add_engine_args(ap)
    ap.add_argument("--conversation-tokens", type=positive_int, default=1500,
                    help="tokens of the conversation before the follow-up (default 1500)")
    ap.add_argument("--answer-tokens", type=positive_int, default=128,
                    help="most tokens of each answer while the conversation is built (default 128)")
    ap.add_argument("--followup-tokens", type=positive_int, default=32,
                    help="tokens generated by each measured follow-up (default 32)")
    ap.add_argument("--sets", default="mtbench,humaneval,gsm8k", help="the user turns' prompt sets, in turn")
    ap.add_argument("--temperature", type=float, default=0.8, help="the sampled run's temperature (default 0.8)")
    ap.add_argument("--top-p", type=float, default=0.95, help="the sampled run's top-p (default 0.95)")
    ap.add_argument("--seed", type=int, default=0, help="the sampled run's seed (default 0)")
    ap.add_argument("--no-server", action="store_true", help="skip the repeated request through tfm-serve's app")
    ap.add_argument("--json", metavar="PATH", help="write the results here")
    args = ap.parse_args(argv)
    if args.no_prompt_cache:
        fail("tfm-bench cache measures the prompt cache: leave out --no-prompt-cache")
    if not args.temperature > 0:
        fail(f"--temperature must be > 0 (the sampled run), got {args.temperature}")
    if args.json:
        check_writable(args.json, "--json")
    from ..decode.sampling import SamplingParams

    try:
        samplings = [("greedy", SamplingParams()),
                     (f"t={args.temperature:g}", SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                                                seed=args.seed))]
    except ValueError as e:
        fail(str(e))
    head = run_record(argv)
    engine = engine_from_args(args)
    files = {"target": engine.target.model.path, "drafter": engine.drafter.model.path if engine.drafter else None}
    runs, repeat, closed = [], None, False
    try:
        print(f"building a conversation of {args.conversation_tokens} tokens:", flush=True)
        messages = build_conversation(engine, args.sets.split(","), args.conversation_tokens, args.answer_tokens)
        for label, sp in samplings:
            r = follow_up(engine, messages, args.answer_tokens, args.followup_tokens, sp)
            runs.append(dict(sampling=label, **r))
            print(table(runs[-1:], None).splitlines()[-1], flush=True)
        if not args.no_server:
            closed = True
            repeat = repeated_request(engine, "bench", runs[-1]["conversation"], args.followup_tokens)
    except (ValueError, LookupError, OSError, RuntimeError) as e:
        fail(str(e))
    finally:
        if not closed:
            engine.close()
    verdict = bar(runs, repeat)
    print(table(runs, repeat))
    print("bar: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in verdict.items()))
    if args.json:
        from ..files.atomic import write_json

        write_json(args.json, dict(**head, bar=verdict, limits=dict(prefill_ratio=MAX_PREFILL_RATIO,
                                   ttft_ratio=MAX_TTFT_RATIO, repeat_cached_ratio=MIN_CACHED_RATIO),
                                   budget=args.budget, tree=args.tree, runs=runs, repeat=repeat,
                                   provenance=provenance(files)))
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
