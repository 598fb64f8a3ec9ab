"""The runtime's command-line tools (thin: parse, call, print); the benchmarks' live in ``tfm_local.bench``.

- ``chat``   ``tfm-chat``: terminal chat and one-shot answers
- ``serve``  ``tfm-serve``: the OpenAI-compatible server (the app itself is ``tfm_local.server``)
- ``train``  ``tfm-train``: the drafter trainer's subcommands (the work is ``tfm_local.train``)
- ``models`` ``tfm-models``: list, pull and remove the built-in models and drafters
- ``common`` options and helpers the tools share (engine options, sampling options, JSON output)
- ``program`` the name a tool shows in usage lines and errors (a dispatcher's subcommand spelling)
"""
