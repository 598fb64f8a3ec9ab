"""``tfm-train weaver``: training a Weaver (``weaver.py``) for a target and its DFlash drafter, both frozen.

Data: the project's target-generated corpora (``corpus``), batched and anchored as for the drafter
(``batching``). For each anchor the target's final hidden states and layer inputs come from the
PyTorch target, the drafter's block pass gives its hidden states and, through the target's LM head,
its top-K candidates of every block position; the Weaver is teacher-forced along the target's own
tokens (the path a verified draft follows while accepted). Loss: the cross-entropy of the target's
token over the candidates, where it is one of them (``weaver.candidate_loss``), averaged over such
positions. Logged: the loss, the top-1 agreement of the Weaver and of the drafter alone, and the
acceptance proxy of a chain of top-1 candidates (tokens accepted per draft, teacher-forced) for both.

Resumable: ``out/weaver.pt`` (written atomically every ``save_every`` steps and at the end) holds the
model, optimiser, step and the identities of target, drafter and corpus; a run started again with the
same inputs continues from it, other inputs are refused.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .batching import IGNORE, Batch, make_batch, plan_batches, usable
from .checkpoint import load_checkpoint, save_checkpoint
from .corpus import target_identity
from .errors import CorruptArtifactError, TrainError
from .model import DFlashDraft, block_mask
from .recipe import head_topk, lr_factor
from .timebudget import TimeBudget
from .weaver import Weaver, WeaverConfig, accepted_prefix, candidate_loss

CKPT = "weaver.pt"


@dataclass
class WeaverOptions:
    """Options of ``fit_weaver``.

    Attributes:
        steps: optimiser steps in total. lr, min_lr, warmup, weight_decay, grad_clip: AdamW with a
            linear warmup (fraction of ``steps``) and cosine decay.
        batch_tokens, anchors, max_len: as the drafter's fit (padded tokens per batch, drafts per
            sequence, sequence cut). seed: batching and anchors.
        holdout: sequences kept out of training (the corpus's last), scored at the end.
        save_every, log_every: steps between checkpoints and between log lines.
        shape: the Weaver's shape beyond the pair's sizes (``WeaverConfig`` fields: width, layers,
            heads, ffn, rank, top_k).
        trees: budgets at which the held-out drafts' τ of chain, DDTree and TfM trees is measured at
            the end (``weaver_eval.compare_trees``; with ``holdout`` > 0; empty = none).
        time_budget_s: wall-clock seconds for this session's training steps (held-out scoring and export
            not counted); the schedule (warmup, cosine decay) is re-fitted to the steps that fit in it
            (``timebudget.TimeBudget``), never beyond ``steps``. None: ``steps`` steps.
    """

    steps: int = 2000
    lr: float = 5e-4
    min_lr: float = 0.0
    warmup: float = 0.03
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    batch_tokens: int = 32768
    anchors: int = 16
    max_len: int = 3072
    seed: int = 0
    holdout: int = 0
    save_every: int = 250
    log_every: int = 10
    shape: dict = field(default_factory=dict)
    trees: tuple = (16, 32, 64)
    time_budget_s: float | None = None


@dataclass
class WeaverInputs:
    """One batch's Weaver inputs (N drafts of D positions, K candidates; on the target's device).

    Attributes:
        h_target ``[N, H_t]``, h_drafter ``[N, D, H_d]``, step_emb ``[N, D, H_t]`` float32;
        cand int64 ``[N, D, K]``, cand_logit and cand_logp float32 ``[N, D, K]`` (the drafter's top-K,
        best first: logits, and log-probabilities over the whole vocabulary); head ``[n_vocab, H_t]``
        the target's LM head (``head_rows``: the candidates' rows); labels int64 ``[N, D]`` (``IGNORE``
        past a sequence's end); root int64 ``[N]`` the anchor's token (step 0).
    """

    h_target: torch.Tensor
    h_drafter: torch.Tensor
    step_emb: torch.Tensor
    cand: torch.Tensor
    cand_logit: torch.Tensor
    head: torch.Tensor
    labels: torch.Tensor
    cand_logp: torch.Tensor
    root: torch.Tensor

    @property
    def head_rows(self) -> torch.Tensor:
        """``[N, D, K, H_t]`` float32: the candidates' LM-head rows."""
        return self.head[self.cand].float()

    def codes(self, weaver: Weaver) -> torch.Tensor:
        """The candidates' codes ``[N, D, K, r]`` (with gradients into P): through the whole head's table
        when there are more candidates than vocabulary rows (less memory and work), else row by row."""
        if self.cand.numel() > self.head.shape[0]:
            return weaver.codes(self.head.float())[self.cand]
        return weaver.codes(self.head_rows)


@torch.no_grad()
def weaver_inputs(target, drafter: DFlashDraft, batch: Batch, top_k: int) -> WeaverInputs:
    """The Weaver's inputs of every valid anchor of ``batch`` (module doc): the target's final hidden
    state before the anchor's token, the drafter's block pass, its top-``top_k`` candidates per
    position and the teacher-forced path (the anchor token, then the target's tokens)."""
    B, L = batch.ids.shape
    S = drafter.config.block_size
    A = batch.anchors.shape[1]
    feats, final = target.layer_inputs_and_final(batch.ids, drafter.feature_layers)
    noise = target.embed(batch.noise).float()
    h = drafter(feats.float(), torch.arange(L, device=batch.ids.device), noise, batch.noise_pos,
                block_mask(batch.anchors, L, S)).view(B, A, S, -1)
    bi, ai = batch.anchor_ok.nonzero(as_tuple=True)
    anchors = batch.anchors[bi, ai]
    h_drafter = h[bi, ai, 1:].float()                                    # [N, D, H_d]
    # 64 drafts at a time: the top-k ids and logits and the log-normaliser (full logits never kept)
    cand, cand_logit, lse = head_topk(target.lm_head, h_drafter, min(top_k, target.head.shape[0]), 64)
    cand_logp = cand_logit - lse
    labels = batch.labels.view(B, A, S)[bi, ai, 1:]
    root = batch.noise.view(B, A, S)[bi, ai, 0]
    path = torch.where(labels[:, :-1] == IGNORE, torch.zeros_like(labels[:, :-1]), labels[:, :-1])
    steps = torch.cat([root[:, None], path], 1)
    return WeaverInputs(final[bi, anchors - 1].float(), h_drafter, target.embed(steps).float(), cand, cand_logit,
                        target.head, labels, cand_logp, root)


def weaver_step_loss(weaver: Weaver, x: WeaverInputs) -> dict:
    """Loss (mean over positions whose target token is a candidate) and counts of one batch:
    ``{"loss" (tensor), "rows", "top1", "top1_drafter", "accepted", "accepted_drafter", "drafts"}``."""
    scores = weaver(x.h_target, x.h_drafter, x.step_emb, x.cand_logit, x.codes(weaver))
    total, rows, top1 = candidate_loss(scores, x.cand, x.labels, IGNORE)
    _, _, base = candidate_loss(x.cand_logit, x.cand, x.labels, IGNORE)
    n = int(rows.sum())
    return {"loss": total / max(n, 1), "rows": n, "top1": int((top1 & rows).sum()),
            "top1_drafter": int((base & rows).sum()), "accepted": float(accepted_prefix(top1).sum()),
            "accepted_drafter": float(accepted_prefix(base).sum()), "drafts": int(x.labels.shape[0])}


def load_frozen_drafter(path: str | os.PathLike, target: str | os.PathLike, device) -> tuple[DFlashDraft, dict]:
    """The drafter a Weaver is trained for (a GGUF, checkpoint or z-lab folder, as ``--init-from``),
    frozen, on ``device``; and its identity record."""
    from .warmstart import load_init_source, load_source

    try:
        src = load_init_source(path, target)
    except CorruptArtifactError as e:
        raise TrainError(f"--drafter {path}: not a readable drafter GGUF, checkpoint or z-lab folder "
                         f"({str(e).split('; delete it')[0]})") from None
    except (TrainError, FileNotFoundError) as e:  # its messages name the option of a fit
        raise type(e)(str(e).replace("--init-from", "--drafter", 1)) from None
    model = DFlashDraft(src.config)
    load_source(model, src)
    model.to(device).eval().requires_grad_(False)
    return model, dict(src.record)


def fit_weaver(corpus, target: str | os.PathLike, drafter: str | os.PathLike, out: str | os.PathLike,
               opts: WeaverOptions, device: str | None = None, progress: bool = False, restart: bool = False,
               log=print) -> dict:
    """Train (or continue training) a Weaver; returns ``{"steps", "loss", "eval", "checkpoint", ...}``.

    Args:
        corpus: a corpus folder or several (``tfm-train data``), generated by ``target``.
        target: the target GGUF. drafter: its DFlash drafter (GGUF, checkpoint or z-lab folder).
        out: run folder (``weaver.pt``). device: torch device (default: CUDA when present).
        restart: ignore an existing checkpoint in ``out``.
    Raises:
        TrainError: a corpus of another target, no usable sequence, a checkpoint of other inputs.
    """
    from .fit import load_corpora
    from .heldout import split
    from .target_torch import TorchTarget

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(out)
    ident = target_identity(target)
    corpus_id, seqs = load_corpora(corpus, ident)
    keep = usable(seqs, opts.max_len)
    if not keep:
        raise TrainError(f"no corpus sequence is usable (each needs a response within {opts.max_len} tokens)")
    train, heldout = split([seqs[i] for i in keep], opts.holdout)
    dft, dft_record = load_frozen_drafter(drafter, target, dev)
    tgt = TorchTarget(target, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    dc = dft.config
    state = None if restart or not (out / CKPT).is_file() else load_checkpoint(out / CKPT)
    if state is not None:
        for key, want in (("target", ident["sha256"]), ("drafter", dft_record.get("sha256")), ("corpus", corpus_id)):
            if state.get(key) != want:
                raise TrainError(f"{out / CKPT} was trained with another {key} ({state.get(key)} != {want}); "
                                 f"use another --out or --restart")
        config = WeaverConfig.from_dict(state["config"])
        if int(state["step"]) >= opts.steps:
            raise TrainError(f"{out / CKPT} is already at step {state['step']}: give --steps above it to train "
                             f"on, or --restart")
        differ = {k: (v, state["config"].get(k)) for k, v in opts.shape.items() if state["config"].get(k) != v}
        if differ:
            raise TrainError(f"{out / CKPT} holds a Weaver of another shape ({', '.join(f'{k} {b}, not {a}' for k, (a, b) in differ.items())}); "
                             f"use another --out or --restart")
    else:
        config = WeaverConfig(target_hidden=tgt.hp.n_embd, drafter_hidden=dc.hidden_size,
                              depth=dc.block_size - 1, **opts.shape)
    if config.top_k > tgt.head.shape[0]:
        raise TrainError(f"--top-k {config.top_k} exceeds the target's vocabulary of {tgt.head.shape[0]} tokens")
    torch.manual_seed(opts.seed)
    weaver = Weaver(config).to(dev)
    optim = torch.optim.AdamW(weaver.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    step = 0
    if state is not None:
        weaver.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step = int(state["step"])

    def save():
        save_checkpoint(out / CKPT, {"config": config.to_dict(), "model": weaver.state_dict(),
                                     "optim": optim.state_dict(), "step": step, "target": ident["sha256"],
                                     "drafter": dft_record.get("sha256"), "drafter_record": dft_record,
                                     "corpus": corpus_id, "options": asdict(opts)})

    def batches(epoch: int):
        lens = [min(len(s.ids), opts.max_len) for s in train]
        for i, idx in enumerate(plan_batches(lens, opts.batch_tokens, opts.seed, epoch)):
            rng = np.random.default_rng([opts.seed, epoch, i])
            yield make_batch([train[j] for j in idx], opts.anchors, dc.block_size, dc.mask_token_id,
                             opts.max_len, rng).to(dev)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=opts.steps, initial=step, desc="weaver", unit="step")
    agg, t0, last = _Totals(), time.time(), {}
    total = opts.steps

    def log_totals() -> dict:
        """Log the steps since the last line (``agg``) and return their summary."""
        summary = agg.summary()
        log(f"[weaver] step {step}/{total} " + " ".join(f"{k} {v:.4g}" for k, v in summary.items())
            + f" ({time.time() - t0:.0f} s)")
        return summary

    budget = (TimeBudget(opts.time_budget_s, t0, step, opts.steps, opts.save_every)
              if opts.time_budget_s is not None else None)
    epoch = 0
    while step < total:
        n_before = step
        for batch in batches(epoch):
            if budget is not None:
                total = budget.step_start(step, total)
                if bar is not None and bar.total != total:
                    bar.total = total
                    bar.refresh()
            if step >= total:
                break
            for g in optim.param_groups:
                g["lr"] = opts.lr * lr_factor(step, total, opts.warmup, opts.min_lr / opts.lr if opts.lr else 0.0)
            res = weaver_step_loss(weaver, weaver_inputs(tgt, dft, batch, config.top_k))
            optim.zero_grad(set_to_none=True)
            if res["rows"]:
                res["loss"].backward()
                torch.nn.utils.clip_grad_norm_(weaver.parameters(), opts.grad_clip)
                optim.step()
            step += 1
            agg.add(res)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{agg.loss():.3f}", accepted=f"{agg.accepted():.2f}",
                                drafter=f"{agg.accepted(base=True):.2f}")
            if step % opts.log_every == 0 or (budget is None and step == total):
                last = log_totals()
                agg = _Totals()
            if step % opts.save_every == 0:
                ts = time.time()
                save()
                if budget is not None:
                    budget.saved(time.time() - ts)
        if step == n_before:
            raise TrainError("the corpus gave no batch (batch_tokens below the shortest sequence?)")
        epoch += 1
    if bar is not None:
        bar.close()
    if agg.s["drafts"]:  # the steps since the last log line
        last = log_totals()
    save()
    result = {"steps": step, "train": last or agg.summary(), "checkpoint": str(out / CKPT),
              "config": config.to_dict(), "params": sum(p.numel() for p in weaver.parameters())}
    if heldout:
        result["eval"] = evaluate_weaver(weaver, tgt, dft, heldout, opts)
        log("[weaver] held out: " + " ".join(f"{k} {v:.4g}" for k, v in result["eval"].items()))
        if opts.trees:
            from .weaver_eval import compare_trees

            result["trees"] = compare_trees(weaver, tgt, dft, heldout, opts, tuple(opts.trees))
            log("[weaver] held-out τ: " + " ".join(f"{k} {v:.3f}" for k, v in result["trees"].items()))
    return result


@torch.no_grad()
def evaluate_weaver(weaver: Weaver, target, drafter: DFlashDraft, seqs, opts: WeaverOptions) -> dict:
    """Loss, top-1 agreement and the chain's acceptance proxy of the Weaver and of the drafter alone
    over ``seqs`` (``heldout_batches``)."""
    agg = _Totals()
    for batch in heldout_batches(seqs, opts, drafter, next(weaver.parameters()).device):
        agg.add(weaver_step_loss(weaver, weaver_inputs(target, drafter, batch, weaver.config.top_k)))
    return agg.summary()


def heldout_batches(seqs, opts: WeaverOptions, drafter: DFlashDraft, device):
    """The held-out sequences' batches with anchors drawn once (``heldout.eval_batches``, seed 0), on ``device``."""
    from .heldout import eval_batches

    dc = drafter.config
    for b in eval_batches(seqs, opts.anchors, dc.block_size, dc.mask_token_id, opts.max_len, opts.batch_tokens, 0):
        yield b.to(device)


class _Totals:
    """Sums of ``weaver_step_loss`` results over several batches."""

    def __init__(self):
        self.s = dict(loss=0.0, rows=0, top1=0, top1_drafter=0, accepted=0.0, accepted_drafter=0.0, drafts=0)

    def add(self, r: dict) -> None:
        self.s["loss"] += float(r["loss"].detach()) * r["rows"]
        for k in ("rows", "top1", "top1_drafter", "accepted", "accepted_drafter", "drafts"):
            self.s[k] += r[k]

    def loss(self) -> float:
        return self.s["loss"] / max(self.s["rows"], 1)

    def accepted(self, base: bool = False) -> float:
        return self.s["accepted_drafter" if base else "accepted"] / max(self.s["drafts"], 1)

    def summary(self) -> dict:
        """loss; top1 / top1_drafter (share of positions whose token is a candidate); accepted /
        accepted_drafter (tokens a chain of top-1 candidates gets accepted per draft); coverage (share
        of positions whose token is among the candidates)."""
        n = max(self.s["rows"], 1)
        return {"loss": self.loss(), "top1": self.s["top1"] / n, "top1_drafter": self.s["top1_drafter"] / n,
                "accepted": self.accepted(), "accepted_drafter": self.accepted(True),
                "positions": float(self.s["rows"])}


def export_weaver(checkpoint: str | os.PathLike, target: str | os.PathLike, out: str | os.PathLike,
                  outtypes=("f16", "q8_0")) -> dict[str, Path]:
    """Weaver GGUFs (``tfm_convert.weaver_gguf``) of a ``weaver.pt`` for ``target``: ``{type: path}``,
    written as ``out/weaver-<type>.gguf`` (``weaver_gguf_from_checkpoint``).

    Raises:
        TrainError: a checkpoint of another target. ConvertError: an unwritable output.
    """
    Path(out).mkdir(parents=True, exist_ok=True)
    return weaver_gguf_from_checkpoint(checkpoint, target, {t: Path(out) / f"weaver-{t}.gguf" for t in outtypes})


def weaver_gguf_from_checkpoint(checkpoint: str | os.PathLike, target: str | os.PathLike,
                                outs: dict[str, Path]) -> dict[str, Path]:
    """Write the Weaver of ``checkpoint`` as GGUF, ``{outtype: path}`` → the same with the paths written;
    the codes table is the target's LM head through P.

    Raises:
        TrainError: not a Weaver checkpoint, or one of another target. ConvertError: an unwritable output.
    """
    from tfm_convert.weaver_gguf import write_weaver_gguf

    from .target_torch import TorchTarget

    state = load_checkpoint(checkpoint)
    if "config" not in state or "model" not in state or "drafter" not in state:
        raise TrainError(f"{checkpoint} is not a Weaver checkpoint (tfm-train weaver's weaver.pt)")
    ident = target_identity(target)
    if state.get("target") != ident["sha256"]:
        raise TrainError(f"{checkpoint} was trained for another target than {ident['name']}")
    weaver = Weaver(WeaverConfig.from_dict(state["config"]))
    weaver.load_state_dict(state["model"])
    head = TorchTarget(target, "cpu", n_layers=0).head.float()
    with torch.no_grad():
        codes = torch.cat([weaver.codes(h) for h in head.split(16384)]).numpy()
    from ..files.drafters import file_key

    identity = {"target_sha256": ident["sha256"], "target_name": ident["name"], "drafter_sha256": state["drafter"],
                "target_key": file_key(Path(target))}
    return {t: write_weaver_gguf(p, weaver.config.to_dict(), weaver.state_dict(), codes, identity, t)
            for t, p in outs.items()}
