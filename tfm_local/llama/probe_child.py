"""The child process of ``probe.probe_model``: ``python -m tfm_local.llama.probe_child PATH`` loads the
file on the CPU, builds a small context and decodes two tokens (a DFlash drafter, whose graph needs its
target, is loaded only), then prints ``probe.OK``. A crash or a hang here is what the probe catches.
"""
from __future__ import annotations

import sys

from .model import Context, Model
from .probe import OK


def main(path: str) -> int:
    m = Model(path, n_gpu_layers=0)
    try:
        if m.arch != "dflash":
            ctx = Context(m, n_ctx=32, n_batch=8, n_ubatch=8, n_threads=1)
            try:
                ctx.decode_tokens([0, min(1, m.n_vocab - 1)], 0, "last")
            finally:
                ctx.close()
    finally:
        m.close()
    print(OK, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
