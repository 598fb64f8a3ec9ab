"""tfm-local: fast local LLM inference on llama.cpp with DFlash-family speculative decoding.

The Python API is :class:`tfm_local.Engine` (imported lazily so that light
modules, such as the model resolver, work without the llama.cpp build).
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
