"""tfm-local: chat with a local LLM on llama.cpp, and serve it, faster with DFlash-family speculative decoding.

The Python API is :class:`tfm_local.Engine` (imported lazily so that light
modules, such as the model resolver, work without the llama.cpp build).

- ``engine``   ``Engine``: prefill, then one decode step after another (the public API)
- ``decode``   one decode step, a module per stage (draft, tree, verify, accept; step, budget,
               sampling, penalties, logprobs, stats)
- ``llama``    the llama.cpp bindings (model and context, our C API, tokenizer and chat template)
- ``files``    model files: specs to GGUF paths, drafters, prompt sets, shared formats, atomic writes
- ``cli``      tfm-chat, tfm-serve, tfm-train; ``server`` the OpenAI-compatible app
- ``train``    the drafter trainer (PyTorch; never on the decode path)
- ``bench``    the benchmarks (never imported by the runtime); ``testing`` tiny synthetic models
- ``lossless`` near-tie checks of greedy outputs; ``stops`` stop strings; ``token_text`` which tokens a
               text stream has given out (per-token records)
- ``conversation`` a long conversation fitted into the context (its oldest turns left out)
"""
__version__ = "0.1.0"
__all__ = ["Engine", "SamplingParams"]


def __getattr__(name):
    if name == "Engine":
        from .engine import Engine
        return Engine
    if name == "SamplingParams":
        from .decode.sampling import SamplingParams
        return SamplingParams
    raise AttributeError(name)
