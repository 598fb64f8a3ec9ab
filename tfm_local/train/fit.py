"""The training loop: corpus + target GGUF → drafter checkpoint (resumable), then export.

``fit`` creates (or resumes from ``out/checkpoint.pt``) a drafter for the
target, trains it with ``recipe`` on the corpus, writes checkpoints
atomically every ``save_every`` steps and at the end, logs to
``out/log.jsonl``, shows a tqdm bar (loss, acceptance proxy τ, learning
rate) and finally exports the z-lab layout and GGUFs (``export``). A new run
may start from the weights of another drafter (``init_from``, see
``warmstart``); a wall-clock budget fits the schedule to the time
(``timebudget``).

Under torchrun (``parallel``) the fit is data-parallel: every process builds the same
plans, one optimiser step takes ``world`` consecutive batches of an epoch's plan (rank r
the r-th), the gradients are averaged over them, and rank 0 alone logs, evaluates the
held-out set and writes checkpoints.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tfm_convert.random_init import random_config
from tfm_convert.target_info import read_target_info

from ..files.atomic import sha256_file
from ..files.dflash import DFlashConfig
from .batching import make_batch, plan_batches, usable
from .checkpoint import load_checkpoint, save_checkpoint
from .corpus import corpus_id, is_reference, load_corpus, order_key, read_manifest, target_identity
from .errors import TrainError
from .emphasis import emphasise, load_kinds
from .heldout import eval_batches, evaluate, split
from .model import DFlashDraft
from .parallel import Comm, process_group
from .recipe import FitOptions, acceptance_proxy, block_loss, lr_factor, position_weights
from .timebudget import TimeBudget
from .walk import walk_tau
from .warmstart import ShapeRequest, grow_layers, load_init_source, load_source

CKPT = "checkpoint.pt"


def drafter_config(target: str | os.PathLike, layers: int, ffn: int | None, n_target_layers: int = 5,
                   mask_token: int | None = None) -> DFlashConfig:
    """A fresh drafter config for ``target`` (tfm_convert's geometry: heads, 5 spread layers, mask token)."""
    return random_config(read_target_info(target), layers=layers, ffn=ffn, n_target_layers=n_target_layers,
                         mask_token=mask_token)


def config_from_dict(d: dict) -> DFlashConfig:
    """Inverse of ``dataclasses.asdict`` for a DFlashConfig."""
    return DFlashConfig(**{**d, "target_layer_ids": tuple(d["target_layer_ids"])})


def _fixed(options: dict) -> dict:
    """The fit options a resumed run must keep (the others may change between runs)."""
    full = {**dataclasses.asdict(FitOptions()), **options}  # options added since the checkpoint: defaults
    # the emphasis file is compared by its contents (``emphasis_sha256``), not by how its path is spelled
    return {k: v for k, v in full.items()
            if k not in ("save_every", "log_every", "max_steps", "time_budget_s", "eval_every", "emphasis")}


def _processes(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def _check_disjoint(seen: dict, folder, manifest: dict, part: list) -> None:
    """TrainError when ``folder`` holds prompt ranks that an earlier corpus of the same prompt order
    (same selection, prompt bound and decoding) already holds: the same prompts would be trained on twice
    (e.g. a slice resumed without its ``-n``). ``seen`` maps an order to (folder, ranks) so far."""
    # responses of another decoding (e.g. sampled) to the same prompts are other data
    order = json.dumps([prompt_order(manifest), manifest["generation"].get("decoding", "greedy")])
    ranks = {s.prompt_index for s in part}
    for other, other_ranks in seen.get(order, []):
        common = ranks & other_ranks
        if common:
            raise TrainError(f"corpora {other} and {folder} share {len(common)} prompts of the same prompt "
                             f"order (ranks {min(common)}..{max(common)}): each would be trained on twice")
    seen.setdefault(order, []).append((folder, ranks))


def _check_heldout_source(corpora, holdout: int) -> None:
    """TrainError when the held-out sequences (the last ``holdout`` of the corpora in the order given)
    would come from a corpus of chosen prompts only (``tfm-train data --only``): the held-out proxy
    would not be comparable with other runs'."""
    last = corpora if isinstance(corpora, (str, os.PathLike)) else list(corpora)[-1]
    manifest = read_manifest(last) if holdout else {"generation": {}}
    if "only" in manifest["generation"]:
        raise TrainError(f"the held-out sequences are the last {holdout} of the corpora as given, and {last} "
                         "holds chosen prompts only (data --only): put a corpus of all prompts last")
    if is_reference(manifest):
        raise TrainError(f"the held-out sequences are the last {holdout} of the corpora as given, and {last} "
                         "holds ShareGPT's replies (data --backend reference), not the target's: put a corpus "
                         "generated by the target last")


def prompt_order(manifest: dict) -> str:
    """The prompt order a corpus's ranks index: its selection and prompt bound, as a JSON string."""
    return order_key(manifest["selection"], manifest["generation"].get("max_prompt_tokens"))


def load_corpora(corpora, ident: dict) -> tuple[str, list]:
    """(identity, sequences) of one corpus folder or several, in the order given; the identity of one
    folder is its ``corpus_id``, of several a hash over theirs.

    Raises:
        TrainError: a corpus generated by another target than ``ident``'s (or not a corpus), or
            two corpora holding the same prompts of one prompt order.
        CorruptArtifactError: a corrupt corpus.
    """
    import hashlib

    folders = [corpora] if isinstance(corpora, (str, os.PathLike)) else list(corpora)
    ids, seqs, seen = [], [], {}
    for folder in folders:
        manifest, part = load_corpus(folder)
        if manifest["target"]["sha256"] != ident["sha256"]:
            raise TrainError(f"corpus {folder} was generated by {manifest['target']['name']}, "
                             f"not by {ident['name']} (sha256 differs)")
        _check_disjoint(seen, folder, manifest, part)
        ids.append(corpus_id(manifest))
        order, ref = prompt_order(manifest), is_reference(manifest)
        seqs.extend(dataclasses.replace(s, prompt_order=order, reference=ref) for s in part)
    return (ids[0] if len(ids) == 1 else hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]), seqs


class _Run:
    """State of one fit: models, optimiser, plans, position.

    A step takes ``group`` = ``comm.world`` × ``accumulate`` consecutive batches of an epoch's
    plan (the last step of an epoch the rest); this process computes those of its rank
    (``steps``). ``step`` and ``total`` count these steps.
    """

    def __init__(self, corpus, target, out, opts, config, comm: Comm, init_from=None, shape=None, grow=None,
                 restart=False, accumulate=1, kinds=None):
        from .target_torch import TorchTarget

        self.out, self.opts, self.comm, self.device = Path(out), opts, comm, comm.device
        self.group = comm.world * accumulate
        self.emphasis_sha256 = sha256_file(opts.emphasis) if opts.emphasis and Path(opts.emphasis).is_file() else None
        ident = target_identity(target)
        self.corpus_id, seqs = load_corpora(corpus, ident)
        _check_heldout_source(corpus, opts.holdout)
        keep = usable(seqs, opts.max_len)
        if not keep:
            raise TrainError(f"corpus {corpus} has no sequence with a response of 2+ tokens")
        self.seqs, self.heldout = split([seqs[i] for i in keep], opts.holdout)
        self.heldout_kinds = _heldout_kinds(self.heldout, kinds)
        self.seqs, self.n_emphasised = emphasise(self.seqs, opts.emphasis, opts.emphasis_times)
        if self.heldout and opts.eval_every < 1:
            raise TrainError(f"eval_every must be >= 1 with held-out sequences, got {opts.eval_every}")
        self.cuda = self.device.type == "cuda"
        self.state = load_checkpoint(self.out / CKPT) if not restart and (self.out / CKPT).is_file() else None
        source = None if self.state or init_from is None else load_init_source(init_from, target)
        if source is not None and grow is not None:
            source = grow_layers(source, grow)
        self.init_record = self.state.get("init_from") if self.state else source and source.record
        self.config = self._resolve_config(target, config, source, shape)
        if self.state and grow is not None and grow != self.config.num_hidden_layers:
            raise TrainError(f"{self.out / CKPT} holds a {self.config.num_hidden_layers}-layer drafter, not "
                             f"--grow-layers {grow}: leave the option out to resume, or --restart")
        self._check_resume(ident)
        torch.manual_seed(opts.seed)  # the initial weights depend on the seed only
        self.drafter = DFlashDraft(self.config).to(self.device)
        if source is not None:
            load_source(self.drafter, source)
        soft = opts.soft_weight > 0 or (opts.reference_weight > 0 and any(s.reference for s in self.seqs))
        self.target = TorchTarget(target, self.device, torch.bfloat16 if self.cuda else torch.float32,
                                  n_layers=None if soft else max(self.drafter.feature_layers))
        self.plans = [plan_batches([min(len(s.ids), opts.max_len) for s in self.seqs], opts.batch_tokens,
                                   opts.seed, e) for e in range(opts.epochs)]
        self.total = sum(-(-len(p) // self.group) for p in self.plans)
        if opts.max_steps is not None:
            self.total = min(self.total, opts.max_steps)
        decay = [p for n, p in self.drafter.named_parameters() if p.dim() > 1]
        no_decay = [p for n, p in self.drafter.named_parameters() if p.dim() <= 1]
        self.optim = torch.optim.AdamW([{"params": decay, "weight_decay": opts.weight_decay},
                                        {"params": no_decay, "weight_decay": 0.0}], lr=opts.lr, betas=(0.9, 0.95))
        self.step, self.ident = 0, ident
        self.eval_set = eval_batches(self.heldout, opts.anchors, self.config.block_size, self.config.mask_token_id,
                                     opts.max_len, opts.batch_tokens, opts.seed) if comm.main else []
        if self.state:
            self.drafter.load_state_dict(self.state["model"])
            self.optim.load_state_dict(self.state["optim"])
            self.step = int(self.state["step"])

    def _resolve_config(self, target, config, source, shape) -> DFlashConfig:
        """The drafter config: the checkpoint's (resume), the source's (warm start), else ``config``, else
        a new one from ``shape`` (5 layers, 3 × hidden MLP, 5 target layers where not given).

        Raises:
            TrainError: ``config`` or ``shape`` disagrees with the checkpoint's or the source's drafter.
        """
        if self.state:
            have, where = config_from_dict(self.state["config"]), f"{self.out / CKPT} holds"
        elif source is not None:
            have, where = (shape or ShapeRequest()).upgrade(source.config), f"--init-from {source.record['path']} is"
        else:
            return config or (shape or ShapeRequest()).new_config(target)
        bad = (shape or ShapeRequest()).mismatches(have)
        if config is not None:
            bad += [f"{f.name} {getattr(config, f.name)} (drafter: {getattr(have, f.name)})"
                    for f in dataclasses.fields(have) if getattr(config, f.name) != getattr(have, f.name)]
        if bad:
            raise TrainError(f"{where} a drafter of another shape than asked ({'; '.join(bad)}): "
                             "pass the same --layers/--ffn/--target-layers/--mask-token/--dflash2/--selector-rank "
                             "or leave them out"
                             + (", or --restart" if self.state else ""))
        return have

    def _check_resume(self, ident: dict) -> None:
        """TrainError unless the checkpoint's run may go on here: same target, corpus, fixed options and
        batches per step (a checkpoint without ``batches_per_step`` was made by one process)."""
        if not self.state:
            return
        if self.state["target_sha256"] != ident["sha256"] or self.state["corpus_id"] != self.corpus_id:
            raise TrainError(f"{self.out / CKPT} was trained on another target or corpus: "
                             "use another --out, or --restart to discard it")
        have, want = _fixed(self.state["options"]), _fixed(dataclasses.asdict(self.opts))
        have["emphasis file"], want["emphasis file"] = self.state.get("emphasis_sha256"), self.emphasis_sha256
        if have != want:
            diff = ", ".join(f"{k} {have.get(k)!r} (now {want.get(k)!r})"
                             for k in sorted(want) if have.get(k) != want.get(k))
            raise TrainError(f"{self.out / CKPT} was made with other fit options: {diff}; "
                             "pass the same options to resume, or --restart")
        group = self.state.get("batches_per_step", 1)
        if group != self.group:
            how = ("without torchrun" if group == 1 else
                   f"`torchrun --standalone --nproc_per_node {group} -m tfm_local.cli.train fit ...`")
            raise TrainError(f"{self.out / CKPT} was trained with {group} batches per step "
                             f"({_processes(self.state.get('world_size', 1))}), this run takes {self.group} "
                             f"({_processes(self.comm.world)}): its steps would be other steps. Resume it {how}, "
                             "or --restart")

    def save(self) -> None:
        """Write the checkpoint of the current step (atomically)."""
        save_checkpoint(self.out / CKPT, {
            "config": dataclasses.asdict(self.config), "options": dataclasses.asdict(self.opts),
            "model": self.drafter.state_dict(), "optim": self.optim.state_dict(), "step": self.step,
            "total_steps": self.total, "corpus_id": self.corpus_id, "world_size": self.comm.world,
            "batches_per_step": self.group, "emphasis_sha256": self.emphasis_sha256,
            "target_sha256": self.ident["sha256"], "target_name": self.ident["name"],
            "init_from": self.init_record})

    def evaluate(self, weights, engine: bool = False) -> dict:
        """Held-out loss and acceptance proxy at the current step (``heldout.evaluate``); with ``engine``
        also the held-out responses walked as the engine does (``walk.walk_tau``: chain, DDTree@16, per kind)."""
        held = evaluate(self.drafter, self.target, self.eval_set, weights, self.config.block_size, self.device,
                        self.cuda)
        if engine:
            held.update(walk_tau(self.drafter, self.target, self.heldout, self.device, self.cuda, self.heldout_kinds))
        return held

    def steps(self):
        """(step, this rank's Batches, batches in the step) from the current step to the end, deterministically.

        Step s takes the next ``group`` batches of the epoch's plan (fewer at the end of an epoch);
        batch j of them goes to rank ``j % world`` (a rank may get none at the end of an epoch). The
        anchors of a batch come from (seed, its index among all the plans' batches): the same batches
        whatever the split.
        """
        step = index = 0
        for plan in self.plans:
            for start in range(0, len(plan), self.group):
                group = plan[start:start + self.group]
                if step >= self.total:
                    return
                if step >= self.step:
                    yield step, [self._batch(idx, index + j) for j, idx in enumerate(group)
                                 if j % self.comm.world == self.comm.rank], len(group)
                step += 1
                index += len(group)

    def _batch(self, idx: list[int], index: int):
        """The Batch of the sequences ``idx``, anchors drawn from (seed, ``index``)."""
        rng = np.random.default_rng([self.opts.seed, index])
        return make_batch([self.seqs[i] for i in idx], self.opts.anchors, self.config.block_size,
                          self.config.mask_token_id, self.opts.max_len, rng)


def _heldout_kinds(heldout: list, path) -> list | None:
    """The kind of each held-out sequence's prompt by a kinds file (None where the file has none for it;
    None for all without a file). Raises TrainError: the file is of another prompt order than any held-out
    sequence's."""
    if path is None:
        return None
    order, kinds = load_kinds(path)
    if heldout and not any(s.prompt_order == order for s in heldout):
        raise TrainError(f"{path} names prompts of another prompt order than the held-out sequences': "
                         "build it from the prompt file the last corpus was generated from")
    return [kinds.get(s.prompt_index) if s.prompt_order == order else None for s in heldout]


def _walked(held: dict) -> str:
    """The engine-style walk's τ of an evaluation, for the progress line ("" without one)."""
    if "walk_chain" not in held:
        return ""
    return f", walked chain {held['walk_chain']:.3f}, ddtree@16 {held['walk_ddtree@16']:.3f}"


def fit(corpus: str | os.PathLike, target: str | os.PathLike, out: str | os.PathLike, opts: FitOptions,
        config: DFlashConfig | None = None, device: str = "cpu", progress: bool = True,
        restart: bool = False, init_from: str | os.PathLike | None = None,
        shape: ShapeRequest | None = None, grow: int | None = None, accumulate: int = 1,
        kinds: str | os.PathLike | None = None) -> Path:
    """Train (or resume training) a drafter; returns the final checkpoint path.

    Args:
        corpus: corpus folder (``tfm-train data``), or a list of them (trained on together).
            target: the target GGUF that generated it.
        out: run folder: ``checkpoint.pt``, ``log.jsonl``.
        opts: FitOptions. config: drafter config for a new run (default: from
            ``shape``, see ``drafter_config``); a resumed or warm-started run
            keeps its own (a different ``config`` given then is an error).
        device: "cuda" or "cpu"; under torchrun "cuda" is each process's ``cuda:LOCAL_RANK``.
            restart: discard an existing checkpoint.
        init_from: a new run starts from the weights of this drafter (z-lab
            folder or checkpoint file; fresh optimiser and schedule); ignored
            when ``out`` holds a checkpoint. Its path and sha256 are recorded in
            the checkpoint (``init_from``) and as the first line of ``log.jsonl``.
        shape: drafter options given explicitly (``--layers`` ...): the shape of a
            new drafter when ``config`` is None; an error when the checkpoint's or
            the source's drafter differs.
        grow: with ``init_from``, deepen the source drafter to this many layers first
            (``warmstart.grow_layers``: appended layers that start as the identity).
        accumulate: batches each process computes per step, their gradients averaged (default 1).
            One process with ``accumulate`` k takes the steps of a fit over k processes (tests check
            a data-parallel fit with it); not a command-line option.
        kinds: a kinds file (``tfm-train kinds``): the held-out walk (at the start of a warm-started run and
            at the end) is also reported per kind of prompt.

    Under torchrun (``WORLD_SIZE`` > 1) the fit is data-parallel (``parallel``): a step takes
    ``WORLD_SIZE`` × ``accumulate`` batches, ``opts.max_steps`` and the log count these steps,
    and only rank 0 logs, evaluates, shows the bar and writes the checkpoint (every rank returns
    its path).

    Raises:
        TrainError: corpus/target mismatch, resume with other options or another number of
            batches per step (processes), a drafter of another shape, a source that does not
            fit the target, weights that differ between the processes, a bad torchrun environment.
        CorruptArtifactError: corrupt corpus or checkpoint.
        FileNotFoundError: ``init_from`` does not exist (new runs only).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if grow is not None and init_from is None:
        raise TrainError("growing a drafter (--grow-layers) needs the drafter to grow (--init-from)")
    if accumulate < 1:
        raise TrainError(f"accumulate must be >= 1, got {accumulate}")
    with process_group(device) as comm:
        run = _Run(corpus, target, out, opts, config, comm, init_from, shape, grow, restart, accumulate, kinds)
        if restart and comm.main and (out / CKPT).exists():  # discarded only once the new run's settings were accepted
            (out / CKPT).unlink()
        _train(run, progress and comm.main)
    return out / CKPT


def _train(run: _Run, progress: bool) -> None:
    """Take the steps of ``run`` from its step to its total and save the last one; rank 0 logs to
    ``out/log.jsonl``, evaluates the held-out set and writes the checkpoints. ``progress``: show a bar."""
    from tqdm import tqdm

    opts, comm = run.opts, run.comm
    weights = position_weights(run.config.block_size, opts.gamma, run.device)
    bar = tqdm(total=run.total, initial=run.step, desc="fit", unit="step", disable=not progress)
    ema_loss = ema_tau = None
    new_run = run.step == 0  # a new run starts a new log (lines of a discarded or unsaved run are dropped)
    t0 = time.time()
    log = open(run.out / "log.jsonl", "w" if new_run else "a", encoding="utf-8") if comm.main else None

    def write(record: dict) -> None:
        if log is not None:
            log.write(json.dumps(record) + "\n")
            log.flush()

    if (new_run and run.init_record) or run.opts.emphasis:  # the emphasis record on a resume too
        write({"step": run.step, "init_from": run.init_record, "sequences": len(run.seqs),
               "emphasised": run.n_emphasised})
        if run.opts.emphasis and not run.n_emphasised and comm.main:
            print(f"warning: no training sequence is of a prompt of {run.opts.emphasis}: nothing is repeated",
                  file=sys.stderr)
    if new_run and run.init_record and run.eval_set:  # the starting point's held-out score (e.g. a q4_0 GGUF's)
        held = run.evaluate(weights, engine=True)
        write({"step": 0, **held})
        bar.write(f"step 0 (--init-from): held-out loss {held['heldout_loss']:.3f}, tau {held['heldout_tau']:.2f}"
                  f"{_walked(held)}")
    budget = (TimeBudget(opts.time_budget_s, t0, run.step, run.total, opts.save_every)
              if opts.time_budget_s is not None and comm.main else None)
    try:
        comm.check_same(run.drafter, run.step)
        for step, mine, n in run.steps():
            if opts.time_budget_s is not None:  # rank 0 re-fits the total, every rank follows it
                total = comm.broadcast_int(budget.step_start(step, run.total) if budget else run.total)
                if total != run.total:  # run.steps reads run.total at every step
                    run.total = bar.total = total
                    bar.refresh()
            lr = opts.lr * lr_factor(step, run.total, opts.warmup, opts.min_lr / opts.lr if opts.lr else 0.0)
            for g in run.optim.param_groups:
                g["lr"] = lr
            run.optim.zero_grad(set_to_none=True)
            loss_sum = tau_sum = 0.0
            for batch in mine:  # gradients add up over this rank's batches
                batch = batch.to(run.device)
                loss, correct = block_loss(run.drafter, run.target, batch, weights, run.config.block_size,
                                           run.cuda, opts.soft_weight, opts.reference_weight)
                loss.backward()
                loss_sum += loss.detach().item()
                tau_sum += acceptance_proxy(correct, batch.anchor_ok)
            comm.average_gradients(run.drafter.parameters(), n)  # the mean of the n batch losses' gradients
            lv, tau = (x / n for x in comm.sum([loss_sum, tau_sum]))
            torch.nn.utils.clip_grad_norm_(run.drafter.parameters(), opts.grad_clip)
            run.optim.step()
            run.step = step + 1
            ema_loss = lv if ema_loss is None else 0.95 * ema_loss + 0.05 * lv
            ema_tau = tau if ema_tau is None else 0.95 * ema_tau + 0.05 * tau
            bar.update(1)
            bar.set_postfix(loss=f"{ema_loss:.3f}", tau=f"{ema_tau:.2f}", lr=f"{lr:.1e}")
            if run.step % opts.log_every == 0 or run.step == run.total:
                write({"step": run.step, "loss": lv, "tau": tau, "lr": lr, "total": run.total,
                       "elapsed_s": round(time.time() - t0, 1)})
            if run.eval_set and (run.step % opts.eval_every == 0 or run.step == run.total):
                held = run.evaluate(weights, engine=run.step == run.total)
                write({"step": run.step, **held})
                bar.write(f"step {run.step}: held-out loss {held['heldout_loss']:.3f}, tau {held['heldout_tau']:.2f}"
                          f"{_walked(held)}")
            if run.step % opts.save_every == 0:
                comm.check_same(run.drafter, run.step)
                if comm.main:
                    t_save = time.time()
                    run.save()
                    if budget is not None:
                        budget.saved(time.time() - t_save)
        comm.check_same(run.drafter, run.step)
        if comm.main:
            run.save()
    finally:
        bar.close()
        if log is not None:
            log.close()
