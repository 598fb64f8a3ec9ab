"""torchrun entry of the data-parallel fit tests (test_train.py): ``tfm-train`` in each process, then
that rank's final step, step total and drafter weights in ``DUMP/rank-R.pt``.

Usage: ``torchrun --standalone --nproc_per_node N tests/torchrun_fit.py DUMP CLOCK ARGS...``
(ARGS: the ``tfm-train`` arguments). CLOCK is ``none`` or each rank's seconds per step,
comma-separated (e.g. ``1,5``): ``time.time`` then stands still except inside ``block_loss``,
where it advances by that rank's amount (as ``test_train._fake_clock``).
"""
import os
import sys
import time

import torch


def main(dump: str, clock: str, argv: list[str]) -> None:
    from tfm_local.cli.train import main as tfm_train
    from tfm_local.train import fit as fit_mod

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    runs, init = [], fit_mod._Run.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        runs.append(self)

    fit_mod._Run.__init__ = keep
    if clock != "none":
        now, per_step, loss = [1000.0], float(clock.split(",")[rank]), fit_mod.block_loss

        def timed(*a, **k):
            now[0] += per_step
            return loss(*a, **k)

        fit_mod.block_loss = timed
        time.time = lambda: now[0]
    tfm_train(argv)
    run = runs[-1]
    torch.save({"step": run.step, "total": run.total, "model": run.drafter.state_dict()},
               os.path.join(dump, f"rank-{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
