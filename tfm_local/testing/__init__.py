"""Test helpers shipped with the package (in the manner of ``numpy.testing``): tiny synthetic
models that llama.cpp loads and runs in milliseconds, for unit tests, examples and benchmarks.

- ``synth``   ``write_tiny_target`` (qwen2 / llama / gemma3 decoders and Gated-DeltaNet hybrids with a
              small byte-level BPE tokenizer), ``write_tiny_qwen35``; small llama.cpp helpers for raw decodes
- ``hybrid``  Gated-DeltaNet hybrid GGUF writer (qwen35, qwen35moe, qwen3next) at any shape
- ``vocab``   the tiny tokenizer and ChatML template the synthetic models carry
- ``fuzz``    damaged GGUF files (every kind of damage) and a child-process loader that tells a clear
              error from a crash or a hang
- ``gdn_ops`` the Gated DeltaNet tree ops run one at a time on numpy arrays, with error bounds
- ``op_harness`` cffi bindings of the op test/bench harness (``ggml_ops/src/tfm-op-harness.h``): one
              ggml op of the installed library run (``run_op``) or timed (``bench_op``) on numpy arrays
"""
