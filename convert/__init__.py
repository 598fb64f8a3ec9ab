"""tfm-convert: DFlash drafter checkpoints → GGUF for llama.cpp's ``dflash`` architecture.

Modules, one job each:

- ``errors``      ConvertError, the one exception users see
- ``gguf_meta``   fast reader of a GGUF's metadata and tensor table
- ``target_info`` facts read from the target GGUF (width, layers, vocabulary, tokenizer)
- ``layout``      the DFlash drafter's tensors: Hugging Face names, GGUF names, shapes
- ``safetensors_io`` minimal safetensors reader/writer (F32/F16/BF16, no torch)
- ``zlab``        the z-lab Hugging Face checkpoint layout (config.json + safetensors)
- ``validate``    checkpoint-against-target checks, all problems in one message
- ``quant``       output types (F32/F16/BF16/Q8_0) per tensor
- ``writer``      the drafter GGUF writer
- ``random_init`` a randomly initialised drafter for any target
- ``vocab``       strip / attach a drafter's tokenizer; ``rewrite_gguf`` (copy a GGUF, add tensors)
- ``draft_vocab`` a reduced draft vocabulary: choosing the ids, writing ``d2t`` + the reduced LM head
- ``atomic``      files that appear only when complete
- ``pipeline``    the two conversions as library calls (convert_checkpoint, init_random)
- ``cli``         ``tfm-convert``
"""
from .errors import ConvertError

__all__ = ["ConvertError"]
