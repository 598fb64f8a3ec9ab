"""tfm-bench load: tfm-serve under concurrent streaming clients, cancellations and bad bodies.

Starts ``tfm-serve`` on a free loopback port (or uses ``--url``), asks it for each prompt's greedy
answer while idle (the reference), then runs ``--clients`` threads for ``--seconds``. Each request is
drawn per client: a streamed chat completion at temperature 0 (its text must equal the reference),
a streamed one at T = 0.8, a stream the client drops after its first chunks, or a malformed body
(bad JSON, wrong types, unknown model: a 4xx is the right answer). Reports every HTTP 5xx, every
well-formed request that failed (an error status, a transport error, a greedy answer that differs,
a stream without its end), p50 / p95 time to the first token and tokens per second of the streams,
and the server's resident memory over the run (``/proc/PID/status``, when the harness started it).
Exits 1 when any 5xx, failed request or mismatch occurred.

    tfm-bench load --target qwen2.5-coder-1.5b-instruct --clients 8 --seconds 600 --json load.json
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from ..cli.program import alias_note, program_name

PROMPTS = ["Write a Python function that reverses a string.", "What is 17 times 23?",
           "Name three primary colors.", "Explain what a hash map is in one sentence.",
           "def fib(n):", "Translate 'good morning' into French.", "List the planets of the solar system.",
           "What does HTTP stand for?"]
BAD_BODIES = [b"{", b"[1, 2]", b'{"model": "m", "messages": "hi"}', b'{"messages": [{"role": "user"}]}',
              b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}',
              b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}']


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str]:
    """tfm-serve on a free loopback port; returns (process, base URL) once /health answers."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "tfm_local.cli.serve", "--port", str(port), "--log-level", "warning",
           "--model-name", "m"]
    for flag in ("target", "drafter", "n_ctx", "threads"):
        v = getattr(args, flag)
        if v is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.startup
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{program_name('tfm-bench-load')}: the server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{program_name('tfm-bench-load')}: the server did not come up")


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


def stream_chat(client, url: str, prompt: str, temperature: float, max_tokens: int, seed: int,
                drop_after: int | None = None) -> dict:
    """One streamed chat completion; returns status, text, time to first token, tokens, whether it ended."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    out = dict(status=None, text="", ttft=None, tokens=0, done=False, seconds=0.0)
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            r.read()
            return out
        chunks = 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out["done"] = True
                break
            doc = json.loads(data)
            if doc.get("usage"):
                out["tokens"] = doc["usage"]["completion_tokens"]
            for ch in doc.get("choices", []):
                piece = (ch.get("delta") or {}).get("content") or ""
                if piece and out["ttft"] is None:
                    out["ttft"] = time.monotonic() - t0
                out["text"] += piece
            chunks += 1
            if drop_after is not None and chunks >= drop_after:
                break  # the client goes away mid-stream
    out["seconds"] = time.monotonic() - t0
    return out


def run_load(url: str, clients: int, seconds: float, max_tokens: int, reference: dict, seed: int,
             pid: int | None = None) -> dict:
    import httpx

    lock = threading.Lock()
    stats = dict(requests=0, by_kind={}, status={}, server_errors=[], failures=[], ttft=[], tps=[], rss=[])
    stop = time.monotonic() + seconds

    def note(kind: str, status, problem: str | None = None):
        with lock:
            stats["requests"] += 1
            stats["by_kind"][kind] = stats["by_kind"].get(kind, 0) + 1
            stats["status"][str(status)] = stats["status"].get(str(status), 0) + 1
            if isinstance(status, int) and status >= 500:
                stats["server_errors"].append(f"{kind}: HTTP {status}")
            if problem:
                stats["failures"].append(f"{kind}: {problem}")

    def client_loop(i: int):
        rng = np.random.default_rng(seed + i)
        with httpx.Client(timeout=300) as client:
            while time.monotonic() < stop:
                u = rng.random()
                prompt = PROMPTS[int(rng.integers(len(PROMPTS)))]
                try:
                    if u < 0.6:
                        r = stream_chat(client, url, prompt, 0.0, max_tokens, 0)
                        bad = None if r["status"] == 200 and r["done"] else f"status {r['status']}, ended {r['done']}"
                        if bad is None and r["text"] != reference[prompt]:
                            bad = f"greedy answer differs for {prompt!r}"
                        note("greedy", r["status"], bad)
                        if r["ttft"] is not None:
                            with lock:
                                stats["ttft"].append(r["ttft"])
                                if r["tokens"] and r["seconds"] > r["ttft"]:
                                    stats["tps"].append(r["tokens"] / r["seconds"])
                    elif u < 0.75:
                        r = stream_chat(client, url, prompt, 0.8, max_tokens, int(rng.integers(1 << 30)))
                        note("sampled", r["status"], None if r["status"] == 200 and r["done"] else f"status {r['status']}")
                    elif u < 0.9:
                        r = stream_chat(client, url, prompt, 0.0, max_tokens, 0, drop_after=2)
                        note("dropped", r["status"], None if r["status"] == 200 else f"status {r['status']}")
                    else:
                        body = BAD_BODIES[int(rng.integers(len(BAD_BODIES)))]
                        r = client.post(url + "/v1/chat/completions", content=body,
                                        headers={"content-type": "application/json"})
                        note("malformed", r.status_code, None if 400 <= r.status_code < 500 else
                             f"status {r.status_code} for {body[:40]!r}")
                except Exception as e:  # noqa: BLE001 - any failure of a request counts (a transport error,
                    note("transport", "error", f"{type(e).__name__}: {e}")  # a reply that is not JSON, ...)

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if pid is not None:
            m = rss_mb(pid)
            if m is not None:
                stats["rss"].append(round(m, 1))
        time.sleep(2.0)
    for t in threads:
        t.join()
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=program_name("tfm-bench-load"), description=__doc__.split("\n\n")[0],
                                 epilog=alias_note("tfm-bench load"))
    ap.add_argument("--url", default=None, help="a running tfm-serve (default: start one)")
    ap.add_argument("--target", default=None, help="the server's target (default: its default)")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--n-ctx", dest="n_ctx", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup", type=float, default=300.0, help="seconds the server may take to start")
    ap.add_argument("--max-growth-mb", type=float, default=50.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.clients < 1 or a.seconds <= 0 or a.max_tokens < 1:
        ap.error("--clients and --max-tokens must be >= 1 and --seconds > 0")
    import httpx

    proc, url = (None, a.url) if a.url else start_server(a)
    try:
        with httpx.Client(timeout=300) as c:  # the references: each prompt's greedy answer, server idle
            reference = {p: stream_chat(c, url, p, 0.0, a.max_tokens, 0)["text"] for p in PROMPTS}
        base = rss_mb(proc.pid) if proc else None
        t0 = time.time()
        st = run_load(url, a.clients, a.seconds, a.max_tokens, reference, a.seed, proc.pid if proc else None)
        elapsed = time.time() - t0
    finally:
        rc = None
        if proc is not None:
            proc.terminate()
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    ttft, tps = np.array(st["ttft"] or [np.nan]), np.array(st["tps"] or [np.nan])
    rss = st["rss"]
    growth = (max(rss) - rss[min(len(rss) - 1, max(len(rss) // 10, 1))]) if len(rss) > 2 else 0.0
    res = dict(argv=list(sys.argv[1:] if argv is None else argv), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), clients=a.clients,
               seconds=round(elapsed, 1), requests=st["requests"], by_kind=st["by_kind"], status=st["status"],
               server_errors=st["server_errors"], failures=st["failures"][:50], n_failures=len(st["failures"]),
               ttft_p50_s=float(np.nanpercentile(ttft, 50)), ttft_p95_s=float(np.nanpercentile(ttft, 95)),
               tokens_per_s_p50=float(np.nanpercentile(tps, 50)), rss_start_mb=base, rss_max_mb=max(rss, default=None),
               rss_growth_after_warmup_mb=round(growth, 1), server_exit=rc)
    # a started server must have run to the end (terminated by us: rc -15 or 0), and requests been made
    ok = (not st["server_errors"] and not st["failures"] and growth <= a.max_growth_mb and st["requests"] > 0
          and (rc is None or rc in (0, -signal.SIGTERM)))
    res["ok"] = ok
    print(f"{st['requests']} requests in {elapsed:.0f} s from {a.clients} clients {st['by_kind']}; statuses "
          f"{st['status']}; 5xx {len(st['server_errors'])}; failed {len(st['failures'])}; time to first token "
          f"p50 {res['ttft_p50_s']:.3f} s p95 {res['ttft_p95_s']:.3f} s; stream {res['tokens_per_s_p50']:.1f} "
          f"tokens/s (p50); server memory +{res['rss_growth_after_warmup_mb']} MiB after warm-up")
    for f in st["failures"][:10]:
        print("failed:", f, file=sys.stderr)
    if a.json:
        from ..files.atomic import write_json
        from .provenance import provenance

        # the files of a server started here (a spec or the default target is named, not hashed);
        # with --url the server's files are its own (its /health or logs name them)
        files = {} if a.url else {"target": a.target or "(tfm-serve's default target)", "drafter": a.drafter}
        write_json(a.json, {**res, "url": a.url, "provenance": provenance(files)})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
