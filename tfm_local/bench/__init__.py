"""Benchmarks (never imported by the runtime). One console script, ``tfm-bench``, runs them as commands
(``commands``: ``tfm-bench COMMAND [options]``; ``tfm-bench --help`` lists them); the old names
``tfm-bench-COMMAND`` still work for one more release:

- ``commands``        ``tfm-bench``: the dispatcher (the chosen command's module only is imported);
                      ``__main__``: the same as ``python -m tfm_local.bench``
- ``tfm_bench``       ``tfm-bench [run]``: plain vs chain / DDTree / auto on HumanEval, GSM8K, MT-Bench,
                      outputs checked against plain, tables, JSON and a plot (matplotlib: the
                      ``bench`` extra)
- ``gdn`` / ``gdn_cli``  ``tfm-bench gdn``: the Gated DeltaNet tree ops against per-branch verification
- ``passes`` / ``drafts`` / ``passes_cli``  ``tfm-bench pass``: one target (or drafter) pass broken down
- ``verify_step`` / ``verify_step_cli``  ``tfm-bench verify``: one verify step of a hybrid target
- ``replay`` / ``replay_cli``  ``tfm-bench replay``: chain τ of drafters replayed on recorded outputs
- ``twin``            ``tfm-bench twin``: random-weight twins of real targets (Q4_K_M types) and their drafters
- ``project``         ``tfm-bench project``: projected speed-ups from one bench's step costs (a twin's) and
                      another's τ (a real pair's)
- ``soak``            ``tfm-bench soak``: many generations in one process, caches checked after each, memory
                      growth after warm-up
- ``prompt_cache``    ``tfm-bench cache``: a follow-up chat turn warm (the prompt cache) against cold, TTFT and
                      tokens prefilled, outputs compared; a repeated request's cached tokens through tfm-serve
- ``structured``      ``tfm-bench structured``: plain against speculative decoding under a grammar (JSON-schema
                      answers, forced tool calls): tokens/s, τ, equal and valid outputs
- ``load``            ``tfm-bench load``: tfm-serve under concurrent streaming clients, dropped streams and bad
                      bodies: 5xx, failed requests, greedy answers against the idle server's, TTFT, memory
- ``trees``           ``tfm-bench trees``: ms of a tree with the Weaver, the TfM heap against DARTree on the host
                      and on the backend, per device
- ``upstream``        upstream llama.cpp's DFlash chain on the same prompts (``python -m``)
- ``profile_passes``  per-kernel CUDA profile of target and drafter passes
- ``tau_by_category`` MT-Bench τ per category of tfm-bench JSON files
- ``provenance``      where a result came from, under ``"provenance"`` in every JSON above: commit and dirty
                      flag, CPU (or GPU, driver, CUDA), the llama.cpp build (system_info, build key, CMake
                      arguments) and the SHA-256 of each model file
"""
