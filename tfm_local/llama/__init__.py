"""The llama.cpp bindings: everything that calls into our patched llama-cpp-python build.

- ``model``     ``Model`` and ``Context`` over llama-cpp-python's low-level API, batches, logits,
                GGUF metadata, threads and the GPU check
- ``native``    cffi bindings of our C API (``ggml_ops/src/tfm-ext.h``): layer features, tree mode,
                tree commit, the backend top-K / argmax attachment; and of the op test/bench harness
                (``ggml_ops/src/tfm-op-harness.h``)
- ``probe``     a model file loaded once in a child process first, so that a file llama.cpp would abort
                on ends in a clear error (remembered per file); ``probe_child`` is the child's side
- ``tokenizer`` tokenizer, streaming detokenizer and the model's chat template
"""
