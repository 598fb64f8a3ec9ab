"""tfm-convert: DFlash drafter checkpoints → GGUF for llama.cpp's ``dflash`` architecture.

Modules, one job each:

- ``errors``      ConvertError, the one exception users see (``convert_errors`` turns the shared
                  helpers' GGUFError / OutputPathError into it)
- ``target_info`` facts read from the target GGUF (width, layers, vocabulary, tokenizer)
- ``safetensors_io`` minimal safetensors reader/writer (F32/F16/BF16, no torch)
- ``zlab``        the z-lab Hugging Face checkpoint layout (config.json + safetensors): read, validate, write
- ``validate``    checkpoint-against-target checks, all problems in one message
- ``quant``       output types (F32/F16/BF16/Q8_0) per tensor
- ``writer``      the drafter GGUF writer
- ``read_drafter`` a drafter GGUF back into its config and float32 weights
- ``random_init`` a randomly initialised drafter for any target
- ``vocab``       strip / attach a drafter's tokenizer; ``rewrite_gguf`` (copy a GGUF, add tensors)
- ``draft_vocab`` a reduced draft vocabulary: choosing the ids, writing ``d2t`` + the reduced LM head
- ``ggml_quant``  ggml's own quantiser, bound from ``libggml-base``
- ``weaver_gguf`` the Weaver's GGUF (``tfm-weaver``): write, read back, refuse another pair
- ``pipeline``    the two conversions as library calls (convert_checkpoint, init_random)
- ``cli``         ``tfm-convert``

The format pieces the runtime and the trainer share with the converter live in ``tfm_local.files``:
``gguf_meta`` (the fast GGUF metadata reader), ``dflash`` (``DFlashConfig`` and the drafter's tensor
layout) and ``atomic`` (files that appear only when complete).
"""
from .errors import ConvertError

__all__ = ["ConvertError"]
