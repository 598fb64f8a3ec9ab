"""Drop the per-prompt token lists from result JSON files, keeping everything else as it was.

    python lab/strip_results.py docs/results/*.json --keep docs/results/bench-cpu-L3i-n40.json

tfm-bench records each prompt's generated ids (``runs[i].output_ids``) and tfm-bench replay the tokens
accepted per step (``runs[i].accepted``). A page needs them only where a result is replayed
(``tfm-bench replay --from FILE``), so the files named by ``--keep`` are left alone. The JSON is written
back with the indentation tfm-bench uses (1), keys in their order. Prints the bytes before and after.
"""
from __future__ import annotations

import argparse
import json
import os

PER_PROMPT_KEYS = ("output_ids", "accepted")


def strip(doc: dict) -> int:
    """Remove the per-prompt lists from ``doc`` in place; returns how many were removed."""
    removed = 0
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if isinstance(runs, list):
        for run in runs:
            if isinstance(run, dict):
                for key in PER_PROMPT_KEYS:
                    if run.pop(key, None) is not None:
                        removed += 1
    return removed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="result JSON files, rewritten in place")
    ap.add_argument("--keep", nargs="*", default=[], help="files to leave unchanged (replay sources)")
    a = ap.parse_args(argv)
    keep = {os.path.realpath(p) for p in a.keep}
    for path in a.files:
        if os.path.realpath(path) in keep:
            continue
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        doc = json.loads(raw)
        if strip(doc):
            text = json.dumps(doc, indent=1, ensure_ascii=False) + ("\n" if raw.endswith("\n") else "")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"{path}: {len(raw.encode())} -> {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
