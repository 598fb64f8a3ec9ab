"""The llama.cpp bindings: everything that calls into our patched llama-cpp-python build.

- ``model``     ``Model`` and ``Context`` over llama-cpp-python's low-level API, batches, logits,
                GGUF metadata, threads and the GPU check
- ``native``    cffi bindings of our runtime C API (``ggml_ops/src/tfm-ext.h``): layer features, batch
                filling, tree mode and commit, the backend top-K / argmax and token samplers, graph
                keeping; the library's loader and version check (``open_library``)
- ``weaver_native`` cffi bindings of the Weaver and DARTree C API (``ggml_ops/src/tfm-weaver.h``, its
                own version)
- ``probe``     a model file loaded once in a child process first, so that a file llama.cpp would abort
                on ends in a clear error (remembered per file); ``probe_child`` is the child's side
- ``tokenizer`` tokenizer, streaming detokenizer and the model's chat template
"""
