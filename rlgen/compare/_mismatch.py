"""`sampler_vs_trainer`: the sampler's logprobs against the trainer's, token by token; `SamplerMismatch`.

Owns: the recipe that scores a result's sampled tokens under a trainer's model and compares (the
inputs checked, each row's temperature found, the forward passes, the per-token numbers), and
`SamplerMismatch`: per-token tensors, a DataFrame lined up with the result's rows, a summary under
verl's and TRL's metric names, where the mismatch concentrates (by position in the response, by
the token's sampled probability, by response length, by staleness), text, HTML and a figure.
Knows nothing about servers or how the rollouts were sampled beyond what they record (their
sampling parameters, per-token weight versions); the forward passes are `compare._mismatch_forward`'s,
the arithmetic `compare._mismatch_metrics`', the figure and HTML `compare._mismatch_views`'.

Definitions: log r = lp_trainer − lp_sampler per token, r = π_trainer / π_sampler the importance
ratio a trainer would weigh the token by, k3 = (r − 1) − log r. The tokens compared are those the
model sampled (`loss_mask`: an episode's environment tokens are context, never compared) whose
two logprobs are finite; prompt positions and padding never count.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core._errors import ModelError
from ._logprobs import not_comparable_reason
from ._mismatch_forward import trainer_logprobs, vocab_size
from ._mismatch_metrics import (
    SAFETY_BOUND,
    bin_index,
    is_metrics,
    mis_fraction,
    offpolicy_metrics,
    power_of_two_edges,
    tis_fraction,
    token_stats,
)

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from matplotlib.figure import Figure

    from ..rollouts._rollouts import Rollouts

__all__ = ["PROBABILITY_EDGES", "SamplerMismatch", "sampler_vs_trainer"]

# SGLang runs temperatures below this greedy, and reports greedy logprobs at temperature 1.
_GREEDY_EPS = 1e-6
# The sampled probability's bins: the rare tokens, where a mismatch matters most, get narrow ones.
PROBABILITY_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 1.0)
# A model's vocabulary may be padded past its tokenizer's (Qwen2.5: 271 ids, Phi-2: 905); more
# than this many unused ids means another model's tokenizer.
_VOCAB_SLACK = 1024


def sampler_vs_trainer(
    rollouts: Rollouts,
    model: Any,
    *,
    temperature: float | None = None,
    tokenizer: Any = None,
    batch_size: int = 8,
    tis_cap: float = 2.0,
    mis: Sequence[float] = (0.5, 2.0),
    current_version: int | None = None,
    progress: bool | None = None,
) -> SamplerMismatch:
    """Score the rollouts' sampled tokens under the trainer's model and compare with the sampled logprobs.

    Args:
        rollouts: a result with logprobs (`eng.generate(..., logprobs=True)`, `eng.submit`, episodes).
        model: the trainer's transformers causal LM, on the CPU or a GPU, in any dtype: it is run
            where it is, under `torch.no_grad()` and in eval mode (its mode is restored after).
        temperature: the temperature the rows were sampled at. SGLang's logprobs are of logits / T,
            so the trainer's logits are divided by the same T. Default: each run's recorded
            sampling parameters (greedy counts as 1); rollouts that record none need it.
        tokenizer: the tokenizer that sampled (the server's); when given, a model whose vocabulary
            does not match it is refused.
        batch_size: rows per forward pass.
        tis_cap: the truncated-IS cap: verl's default 2.0 (`rollout_is_threshold`), TRL's 3.0
            (`vllm_importance_sampling_clip_max`).
        mis: the masked-IS bounds (lower, upper): verl's Seq-MIS preset uses (0.5, 2.0).
        current_version: the trainer's weight version index, for `by_staleness()`; default the
            newest version among the rollouts' tokens (`rollouts.versions`).
        progress: a progress line (True, False, None = once the forward passes have run a second).

    Returns:
        A `SamplerMismatch` (see there).

    Raises:
        TypeError: rollouts is not a Rollouts, or model is not a torch module.
        ValueError: empty rollouts, no logprobs, no temperature known, an option out of range.
        ModelError: the model cannot score these tokens (ids past its vocabulary) or its
            vocabulary does not match `tokenizer`.

    Usage::

        res = eng.generate(prompts, n=8, temperature=0.7, logprobs=True)
        mm = rlgen.sampler_vs_trainer(res, trainer_model, tokenizer=tok)
        mm.summary["k3_kl"], mm.by_probability(), mm.plot()
        res = res.with_columns({"log_ppl_diff": mm.df["log_ppl_diff"]})
    """
    import torch

    # 1) inputs: a non-empty result with logprobs, options in range
    _check_rollouts(rollouts)
    lower, upper = _check_options(batch_size=batch_size, tis_cap=tis_cap, mis=mis, current_version=current_version)
    # 2) the model can score these tokens: its vocabulary against the ids and the tokenizer
    _check_model(model, rollouts, tokenizer)
    # 3) each row's temperature, and why the two sides may differ by construction
    temps, notes = row_temperatures(rollouts, temperature)
    for note in notes:
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    # 4) the trainer's logprobs of exactly the sampled tokens
    t = {k: v.cpu() for k, v in rollouts.tensors().items()}
    trainer = trainer_logprobs(model, prompt_ids=t["prompt_ids"], prompt_mask=t["prompt_mask"],
                               response_ids=t["response_ids"], response_mask=t["response_mask"],
                               temperatures=torch.from_numpy(temps), batch_size=batch_size, progress=progress)
    # 5) per token, in float64, over the sampled tokens whose two logprobs are finite
    sampler = t["logprobs"]
    mask = t["loss_mask"] & sampler.isfinite() & trainer.isfinite()
    log_ratio = torch.where(mask, trainer.double() - sampler.double(), 0.0)
    missing = int((t["loss_mask"] & ~mask).sum())
    versions = getattr(rollouts, "versions", None)
    versions = versions.cpu() if versions is not None else None
    if current_version is None and versions is not None and bool((versions >= 0).any()):
        current_version = int(versions.max())
    # 6) the result
    return SamplerMismatch(
        trainer_logprobs=trainer, sampler_logprobs=sampler.clone(), log_ratio=log_ratio,
        ratio=torch.where(mask, log_ratio.exp(), 0.0), k3=torch.where(mask, log_ratio.expm1() - log_ratio, 0.0),
        mask=mask, lengths=t["response_mask"].sum(-1).numpy(), versions=versions, current_version=current_version,
        df=_row_table(trainer, sampler, log_ratio, mask, rollouts.df, temps, tis_cap=tis_cap, mis=(lower, upper)),
        summary=_summary(trainer, sampler, log_ratio, mask, temps, tis_cap=tis_cap, mis=(lower, upper),
                         missing=missing),
        tis_cap=float(tis_cap), mis_bounds=(lower, upper), missing=missing,
        notes=tuple(notes),
    )


@dataclass(frozen=True, repr=False, eq=False)
class SamplerMismatch:
    """What `sampler_vs_trainer` found: the sampler's logprobs against the trainer's, per token.

    - Per-token tensors, [N, R] on the CPU, aligned with `rollouts.response_ids`:
      `trainer_logprobs` (float32, the trainer's log_softmax(logits / T) of each sampled token; 0.0
      on padding), `sampler_logprobs` (float32, the rollouts' own), and over the compared tokens
      (`mask`, bool) `log_ratio` (float64, trainer − sampler), `ratio` (float64, exp(log_ratio)) and
      `k3` (float64), all three 0.0 where `mask` is False.
    - `df`: one row per row of the rollouts (the same index): prompt_index, sample_index,
      completion_tokens, temperature, tokens_compared, trainer_logprob_sum, sampler_logprob_sum,
      log_ratio_sum (the log of the sequence IS weight), log_ratio_mean (of the geometric mean),
      log_ratio_max_abs, k3_sum, k3_mean, seq_ratio (exp(log_ratio_sum), clamped to ±20 in log),
      training_ppl, rollout_ppl, log_ppl_diff (= −log_ratio_mean, verl's), tis_clipped and
      mis_masked (the row's tokens a token-level TIS clips and MIS masks), seq_tis_clipped and
      seq_mis_masked (whether a sequence-level TIS clips, MIS masks, the row). NaN numbers for a
      row with no token compared.
    - `summary`: rows, rows_compared, tokens, missing (sampled tokens left out: a logprob NaN or
      infinite), temperature (None when rows differ), the thresholds, verl's `offpolicy_metrics`
      and `is_metrics` (kl, k3_kl, training_ppl, rollout_ppl, log_ppl_diff, ppl_ratio, chi2_token,
      chi2_seq, rollout_is_eff_sample_size, ...), TRL's sampling_logp_difference/{mean,max}, and
      the shares a correction would touch: tis_token_clip_fraction, tis_seq_clip_fraction,
      mis_token_mask_fraction, mis_seq_mask_fraction.
    - `by_position()`, `by_probability()`, `by_length()`, `by_staleness()`: where it concentrates.
    - `lengths` ([N] response lengths), `versions` (the rollouts' [N, R] weight versions or None),
      `current_version`, `tis_cap`, `mis_bounds`, `missing`, `notes` (why the two sides may differ
      by construction: penalties, top-p/top-k, a temperature other than the recorded one).
    """

    trainer_logprobs: torch.Tensor
    sampler_logprobs: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    k3: torch.Tensor
    mask: torch.Tensor
    lengths: np.ndarray
    versions: torch.Tensor | None
    current_version: int | None
    df: pd.DataFrame
    summary: dict[str, Any]
    tis_cap: float
    mis_bounds: tuple[float, float]
    missing: int
    notes: tuple[str, ...] = ()

    # -- where it concentrates -------------------------------------------------------------------
    def _tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, positions, log ratios) of the compared tokens, flat, row-major."""
        rows, positions = (x.numpy() for x in self.mask.nonzero(as_tuple=True))
        return rows, positions, self.log_ratio[self.mask].numpy()

    def _stats(self, groups: np.ndarray, log_ratio: np.ndarray, n: int) -> dict[str, np.ndarray]:
        lower, upper = self.mis_bounds
        return token_stats(groups, log_ratio, n, cap=self.tis_cap, lower=lower, upper=upper)

    def by_position(self, bins: Sequence[int] | None = None) -> pd.DataFrame:
        """The mismatch by position in the response: one row per bin [position_start,
        position_end) with tokens and the token statistics (`_mismatch_metrics.token_stats`:
        log_ratio_mean, abs_log_ratio_mean, k3_mean, ratio_mean, chi2_token, tis_clip_fraction,
        mis_mask_fraction). `bins`: the edges (positions count from 0); default 0, 1, 2, 4, 8, ...
        Bins without a token are left out."""
        _, positions, lr = self._tokens()
        edges = list(bins) if bins is not None else power_of_two_edges(0, int(positions.max(initial=0)))
        return _binned(self._stats(bin_index(positions, edges), lr, len(edges) - 1), edges, "position")

    def by_probability(self, bins: Sequence[float] | None = None) -> pd.DataFrame:
        """The mismatch by the token's sampled probability exp(sampler logprob): one row per bin
        [p_start, p_end) (the last closed) with the token statistics of `by_position`. Default
        edges `PROBABILITY_EDGES` (0, 0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 1)."""
        rows, positions, lr = self._tokens()
        p = np.exp(self.sampler_logprobs.double().numpy()[rows, positions])
        edges = list(bins) if bins is not None else list(PROBABILITY_EDGES)
        return _binned(self._stats(bin_index(p, edges, closed_last=True), lr, len(edges) - 1), edges, "p")

    def by_length(self, bins: Sequence[int] | None = None) -> pd.DataFrame:
        """The mismatch by response length (tokens): one row per bin [length_start, length_end)
        with rows (compared), the token statistics of `by_position` over their tokens, and per
        sequence seq_log_ratio_mean (the mean log of the sequence weight), seq_tis_clip_fraction and
        seq_mis_mask_fraction. Default edges 1, 2, 4, 8, ..."""
        rows, _, lr = self._tokens()
        edges = list(bins) if bins is not None else power_of_two_edges(1, int(self.lengths.max(initial=1)))
        row_bin = bin_index(self.lengths.astype(np.float64), edges)
        n = len(edges) - 1
        out = self._stats(row_bin[rows], lr, n)
        compared = self.df["tokens_compared"].to_numpy() > 0
        key = np.where(compared, row_bin, -1)
        seq = {
            "seq_log_ratio_mean": self.df["log_ratio_sum"].to_numpy(dtype=np.float64),
            "seq_tis_clip_fraction": self.df["seq_tis_clipped"].to_numpy(dtype=np.float64),
            "seq_mis_mask_fraction": self.df["seq_mis_masked"].to_numpy(dtype=np.float64),
        }
        count = np.bincount(key[key >= 0], minlength=n)
        extra: dict[str, np.ndarray] = {"rows": count}
        with np.errstate(invalid="ignore", divide="ignore"):
            for name, values in seq.items():
                sums = np.bincount(key[key >= 0], weights=values[key >= 0], minlength=n)
                extra[name] = np.where(count > 0, sums / np.maximum(count, 1), np.nan)
        return _binned({**extra, **out}, edges, "length")

    def by_staleness(self) -> pd.DataFrame:
        """The mismatch by staleness, `current_version` − the version that sampled the token: one
        row per staleness with tokens, rows (with a token of it) and the token statistics of
        `by_position`. Tokens of unknown version (-1) are left out. Needs per-token versions
        (`rollouts.versions`: every `generate()` and `eng.submit` result has them)."""
        import pandas as pd

        if self.versions is None or self.current_version is None:
            raise ValueError("these rollouts carry no per-token weight versions (rollouts.versions is None): "
                             "sample them with eng.generate(...) or eng.submit(...) to break the mismatch down by "
                             "staleness")
        rows, positions, lr = self._tokens()
        version = self.versions.numpy()[rows, positions]
        known = version >= 0
        staleness = self.current_version - version[known]
        levels, groups = np.unique(staleness, return_inverse=True)
        stats = self._stats(groups.astype(np.int64), lr[known], len(levels))
        row_count = [len(np.unique(rows[known][groups == i])) for i in range(len(levels))]
        return pd.DataFrame({"staleness": levels.astype(np.int64), "tokens": stats.pop("tokens"),
                             "rows": np.asarray(row_count, dtype=np.int64), **stats})

    # -- display ---------------------------------------------------------------------------------
    def plot(self) -> Figure:
        """A figure of the mismatch: by position in the response, by sampled probability, the
        histogram of log r with the TIS cap and the MIS bounds, and by staleness when the tokens
        were sampled by more than one weight version. matplotlib is imported now."""
        from ._mismatch_views import mismatch_figure

        staleness = self.by_staleness() if self.versions is not None and self.current_version is not None else None
        return mismatch_figure(position=self.by_position(), probability=self.by_probability(),
                               log_ratio=self.log_ratio[self.mask].numpy(), tis_cap=self.tis_cap,
                               mis_bounds=self.mis_bounds, staleness=staleness, title=self._headline())

    def _headline(self) -> str:
        s = self.summary
        if not s["tokens"]:
            return f"SamplerMismatch: no token compared ({self.missing} missing)"
        temperature = "T per run" if s["temperature"] is None else f"T={s['temperature']:g}"
        return (f"SamplerMismatch: {s['tokens']} tokens in {s['rows_compared']} rows ({temperature}) | "
                f"|log r| mean {s['sampling_logp_difference/mean']:.3g}, max {s['sampling_logp_difference/max']:.3g}; "
                f"k3_kl {s['k3_kl']:.3g}, chi2_token {s['chi2_token']:.3g} | "
                f"TIS({self.tis_cap:g}) clips {s['tis_token_clip_fraction']:.1%} of tokens, "
                f"{s['tis_seq_clip_fraction']:.1%} of sequences; MIS[{self.mis_bounds[0]:g}, {self.mis_bounds[1]:g}] "
                f"masks {s['mis_token_mask_fraction']:.1%} / {s['mis_seq_mask_fraction']:.1%} | "
                f"ESS {s['rollout_is_eff_sample_size']:.4g}")

    def __repr__(self) -> str:
        missing = f" | {self.missing} missing" if self.missing else ""
        notes = "".join(f" | note: {n}" for n in self.notes)
        return f"<{self._headline()}{missing}{notes}>"

    def _repr_html_(self) -> str:
        from ._mismatch_views import summary_html

        return summary_html(self.summary, title=self._headline(), notes=self.notes, missing=self.missing,
                            probability=self.by_probability())


# -- checks ----------------------------------------------------------------------------------------
def _check_rollouts(rollouts: Any) -> None:
    from ..rollouts._rollouts import Rollouts

    if not isinstance(rollouts, Rollouts):
        raise TypeError(f"rollouts must be a Rollouts (eng.generate(..., logprobs=True)), got {type(rollouts).__name__}")
    if not len(rollouts):
        raise ValueError("rollouts is empty: nothing to compare; pass the rows of a generate() call")
    if rollouts.logprobs is None:
        raise ValueError("these rollouts have no sampled logprobs: generate them with logprobs=True")


def _check_options(*, batch_size: int, tis_cap: float, mis: Any, current_version: int | None
                   ) -> tuple[float, float]:
    """The MIS bounds as floats; ValueError, saying what to pass, for an option out of range."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1 (rows per forward pass), got {batch_size!r}")
    if isinstance(tis_cap, bool) or not isinstance(tis_cap, (int, float)) or not (math.isfinite(tis_cap) and tis_cap >= 1):
        raise ValueError(f"tis_cap must be a number >= 1, e.g. 2.0 (verl) or 3.0 (TRL), got {tis_cap!r}")
    if isinstance(mis, str) or not isinstance(mis, Sequence) or len(mis) != 2 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in mis) \
            or not mis[0] < mis[1]:
        raise ValueError(f"mis must be two bounds (lower, upper) with 0 < lower < upper, e.g. (0.5, 2.0), got {mis!r}")
    if current_version is not None and (isinstance(current_version, bool) or not isinstance(current_version, int)):
        raise ValueError(f"current_version must be an int (a weight version index) or None, got {current_version!r}")
    return float(mis[0]), float(mis[1])


def _check_model(model: Any, rollouts: Rollouts, tokenizer: Any) -> None:
    """TypeError for what is not a torch module; ModelError when the model cannot score the
    rollouts' ids or its vocabulary does not match the tokenizer's."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a transformers causal LM (a torch.nn.Module), got {type(model).__name__}")
    vocab = vocab_size(model)
    if vocab is None:
        return
    t = rollouts.tensors()
    used = torch.cat([t["prompt_ids"][t["prompt_mask"]], t["response_ids"][t["response_mask"]]])
    top = int(used.max()) if used.numel() else -1
    if top >= vocab:
        raise ModelError(f"token id {top} is past the model's vocabulary of {vocab} ids: these rollouts were sampled by "
                         f"another model ({rollouts.model or 'unknown'}); pass the trainer of the model that sampled")
    if tokenizer is None:
        return
    try:
        size = len(tokenizer)
    except TypeError:
        raise TypeError(f"tokenizer must be a tokenizer (len(tokenizer) its size), got {type(tokenizer).__name__}") from None
    if size > vocab or vocab - size > _VOCAB_SLACK:
        raise ModelError(f"the tokenizer has {size} tokens and the model's vocabulary {vocab} ids: they belong to different "
                         f"models; pass the trainer of the model that sampled ({rollouts.model or 'unknown'}) and the "
                         "server's tokenizer")


def row_temperatures(rollouts: Rollouts, temperature: float | None) -> tuple[np.ndarray, list[str]]:
    """Each row's temperature for the trainer's logits ([N] float64), and notes on why the sampled
    logprobs may differ from the trainer's by construction (one per run and reason)."""
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not (math.isfinite(temperature) and temperature >= 0)):
        raise ValueError(f"temperature must be a number >= 0 (0: greedy, scored at 1 as SGLang does), got {temperature!r}")
    given = None if temperature is None else (1.0 if temperature < _GREEDY_EPS else float(temperature))
    runs = rollouts.df["run"].to_numpy() if "run" in rollouts.df else np.full(len(rollouts), "")
    temps, notes = np.empty(len(runs), dtype=np.float64), []
    for run in dict.fromkeys(runs.tolist()):
        sampling = rollouts.run_sampling.get(run, rollouts.sampling) if run else rollouts.sampling
        recorded = _recorded_temperature(sampling)
        if given is None and recorded is None:
            raise ValueError("these rollouts do not record the temperature they were sampled at (hand-built, or from "
                             "a file without it): pass temperature=")
        if given is not None and recorded is not None and abs(given - recorded) > _GREEDY_EPS:
            notes.append(f"run {run!r} was sampled at temperature {recorded:g} and is scored at temperature={given:g}: "
                         "the mismatch includes the temperature's")
        temps[runs == run] = given if given is not None else recorded
        notes.extend(f"run {run!r} {note}" for note in _sampling_notes(sampling))
    return temps, notes


def _recorded_temperature(sampling: dict[str, Any] | None) -> float | None:
    """The temperature SGLang's logprobs of these samples are at: 1 for greedy and scores."""
    if sampling is None:
        return None
    if sampling.get("score"):
        return 1.0
    value = float(sampling.get("temperature", 1.0))
    return 1.0 if value < _GREEDY_EPS or sampling.get("top_k") == 1 else value


def _sampling_notes(sampling: dict[str, Any] | None) -> list[str]:
    """Why logprobs sampled with these parameters differ from the trainer's by construction."""
    if not sampling or sampling.get("score"):
        return []
    notes = []
    reason = not_comparable_reason({**sampling, "temperature": 1.0})  # the temperature is matched here
    if reason is not None:
        notes.append(reason.removeprefix("not comparable: ").split("; re-score")[0] + ": the mismatch includes it")
    top_k, top_p, min_p = sampling.get("top_k", -1), float(sampling.get("top_p", 1.0)), float(sampling.get("min_p", 0.0))
    filters = [f"{name}={value:g}" for name, value, on in (
        ("top_p", top_p, top_p < 1.0), ("top_k", top_k, isinstance(top_k, int) and top_k > 1),
        ("min_p", min_p, min_p > 0.0)) if on]
    if filters:
        notes.append(f"was sampled with {', '.join(filters)}: SGLang's logprobs are of the distribution before that "
                     "filter, the tokens were drawn after it, so the ratio leaves the filter out; sample with top_p=1, "
                     "top_k=-1, min_p=0 for a clean measurement")
    return notes


# -- the tables ------------------------------------------------------------------------------------
def _row_table(trainer: torch.Tensor, sampler: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
               df: pd.DataFrame, temps: np.ndarray, *, tis_cap: float, mis: tuple[float, float]) -> pd.DataFrame:
    """The per-row DataFrame of `SamplerMismatch.df`, on the rollouts' index."""
    import pandas as pd

    m = mask.numpy()
    lr = log_ratio.numpy()
    n = m.sum(axis=1)
    has = n > 0

    def per_row(values: np.ndarray) -> np.ndarray:
        return np.where(has, values, np.nan)

    def total(values: torch.Tensor) -> np.ndarray:
        return np.asarray(np.where(m, values.double().numpy(), 0.0).sum(axis=1), dtype=np.float64)

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        lr_sum, k3_sum = lr.sum(axis=1), (np.expm1(lr) - lr).sum(axis=1)
        train_mean, samp_mean = total(trainer) / n, total(sampler) / n
        seq_log = np.clip(lr_sum, -SAFETY_BOUND, SAFETY_BOUND)
        out = {
            "prompt_index": df["prompt_index"].to_numpy(), "sample_index": df["sample_index"].to_numpy(),
            "completion_tokens": df["completion_tokens"].to_numpy(), "temperature": temps,
            "tokens_compared": n.astype(np.int64),
            "trainer_logprob_sum": per_row(total(trainer)), "sampler_logprob_sum": per_row(total(sampler)),
            "log_ratio_sum": per_row(lr_sum), "log_ratio_mean": per_row(lr_sum / n),
            "log_ratio_max_abs": per_row(np.abs(lr).max(axis=1, initial=0.0)),
            "k3_sum": per_row(k3_sum), "k3_mean": per_row(k3_sum / n), "seq_ratio": per_row(np.exp(seq_log)),
            "training_ppl": per_row(np.exp(-train_mean)), "rollout_ppl": per_row(np.exp(-samp_mean)),
            "log_ppl_diff": per_row(samp_mean - train_mean),
            "tis_clipped": (m & (lr > math.log(tis_cap))).sum(axis=1).astype(np.int64),
            "mis_masked": (m & ((lr < math.log(mis[0])) | (lr > math.log(mis[1])))).sum(axis=1).astype(np.int64),
            "seq_tis_clipped": has & (lr_sum > math.log(tis_cap)),
            "seq_mis_masked": has & ((lr_sum < math.log(mis[0])) | (lr_sum > math.log(mis[1]))),
        }
    return pd.DataFrame(out, index=df.index)


def _summary(trainer: torch.Tensor, sampler: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
             temps: np.ndarray, *, tis_cap: float, mis: tuple[float, float], missing: int) -> dict[str, Any]:
    lower, upper = mis
    unique = np.unique(temps)
    out: dict[str, Any] = {
        "rows": int(mask.shape[0]), "rows_compared": int(mask.any(-1).sum()), "tokens": int(mask.sum()),
        "missing": missing, "temperature": float(unique[0]) if unique.size == 1 else None,
        "tis_cap": float(tis_cap), "mis_lower": lower, "mis_upper": upper,
    }
    out.update(offpolicy_metrics(trainer.double(), sampler.double(), mask))
    out.update(is_metrics(log_ratio, mask, cap=tis_cap))
    out["tis_token_clip_fraction"] = tis_fraction(log_ratio, mask, cap=tis_cap, level="token")
    out["tis_seq_clip_fraction"] = tis_fraction(log_ratio, mask, cap=tis_cap, level="sequence")
    out["mis_token_mask_fraction"] = mis_fraction(log_ratio, mask, lower=lower, upper=upper, level="token")
    out["mis_seq_mask_fraction"] = mis_fraction(log_ratio, mask, lower=lower, upper=upper, level="sequence")
    return out


def _binned(stats: dict[str, np.ndarray], edges: Sequence[float], name: str) -> pd.DataFrame:
    """A bin table: `<name>_start`, `<name>_end`, then the statistics; bins without a token left out."""
    import pandas as pd

    e = np.asarray(edges)
    frame = pd.DataFrame({f"{name}_start": e[:-1], f"{name}_end": e[1:], **stats})
    return frame[frame["tokens"] > 0].reset_index(drop=True)
