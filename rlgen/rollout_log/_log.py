"""`RolloutLog`: a training run's results, step by step, in one append-only folder.

Owns: the public face of a log: creating and opening one (`log.json` marks the folder as a log and
says where its rows came from), appending a result as a part of a step (its (step, name) claimed
first, so that of writers appending it at once exactly one wins), listing parts and steps
(and the steps missing from a regular stride), reading rows (light columns of many steps as one
DataFrame; whole results of a step or a range), reward versions (`rescore`, `rewards`, `versions`),
the diff of two versions (over the rows both scored; what one left out named in its notes), the
trend across steps, one prompt across steps, SQL, and the notebook view. Knows nothing about how files are stored (`_store`), laid out (`_parts`), scored
(`_rescore`), versioned (`_versions`), compared (`compare._reward_diff`) or drawn (`_views`).

Words, said once (docs/architecture.md): a *log* is this folder; a *part* is one logged call's
rows (one file, never modified); a *step* is the training step a part belongs to; a *prompt key*
names a prompt across steps; a *reward version* is one scoring of the rows (`logged`: what the run
wrote; others: `rescore`), with its *lineage* (which functions, which source, which parameters).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..core._errors import LogError
from ..core._options import RescoreOptions, resolve, takes_options
from ..rollouts._rollouts import Rollouts
from ._parts import (
    CLAIMS,
    PARTS,
    SUMMARIES,
    LightCache,
    PartName,
    claim_record,
    part_bytes,
    read_full,
    read_light,
    read_summaries,
    step_prefix,
    write_index,
)
from ._store import Store, open_store
from ._versions import LOGGED, logged_columns, read_lineage, read_version, scored_parts, version_names

if TYPE_CHECKING:
    import pandas as pd
    from typing_extensions import Unpack

    from ..compare._reward_diff import RewardDiff
    from ..rewards._scoring import RewardFunctions
    from ._browser import LogBrowser
    from ._text_rows import TextStep
    from ._views import LogPlots

__all__ = ["RolloutLog"]

_MARKER = "log.json"
_FORMAT = "rlgen-rollout-log"
_VERSION = 1
_SUMMARY = 1  # _views.SUMMARY_VERSION: a summary of another version is recomputed from the rows
Steps = int | range | Sequence[int] | None
_INDEX_EVERY = 256  # append: after this many parts of one writer, their summaries gather into an index
_PREFIX_STEPS = 8  # up to this many steps are listed one prefix each; more, the whole folder once


class RolloutLog:
    """A training run's results by step: appended by a loop, read (while it runs, too) by a notebook.

    Write from a training loop::

        log = rlgen.RolloutLog.create("runs/exp1")          # or an fsspec URL: "s3://bucket/exp1"
        for step in range(steps):
            res = eng.generate(prompts, n=8, logprobs=True).add_rewards(reward)
            log.append(step, res)                            # one part, visible only once complete

    Read it, in the same kernel or another one::

        log = rlgen.RolloutLog("runs/exp1")
        log.trend()                       # per step: mean reward, length, finish reasons, zero-variance share
        log.rows(steps=range(100, 200), columns=["completion", "reward"])   # a DataFrame, only what is asked
        log.load(150)                     # step 150 as a Rollouts (Episodes for episodes): tensors, views
        log.rescore({"strict": strict}, version="strict")   # a new reward version; nothing overwritten
        log.diff("logged", "strict")      # what changed, which groups flipped, where they part ways

    Every read lists the parts again, so a log another process is writing shows its new steps.
    """

    def __init__(self, path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
                 tokenizer: Any = None) -> None:
        """Open the log at `path` (a folder, or an fsspec URL with `storage_options`). `tokenizer`
        (an object, or a local path or name): for the token text of the results it loads, where
        the one the parts name is not on this machine (a log recorded elsewhere).

        Raises:
            LogError: nothing is there (create one with `RolloutLog.create`), or the folder is not a log.
        """
        store = open_store(path, storage_options=storage_options)
        if not store.exists(_MARKER):
            hint = ("it holds files but no log.json: not a rollout log (import a framework's folder with "
                    "RolloutLog.from_trl / from_verl)" if store.is_dir() else "nothing is there")
            raise LogError(f"{store.url} is not a rollout log: {hint}; to start one: rlgen.RolloutLog.create({store.url!r})",
                           path=store.url)
        info = json.loads(store.read_bytes(_MARKER))
        if info.get("format") != _FORMAT or info.get("version") != _VERSION:
            raise LogError(f"{store.url}/{_MARKER} is not a version-{_VERSION} rollout log ({info.get('format')!r} "
                           f"version {info.get('version')!r}); read it with the rlgen that wrote it ({info.get('rlgen')})",
                           path=store.url)
        self._store = store
        self._info: dict[str, Any] = info
        self._cache = LightCache()
        self._tokenizer = tokenizer
        self._appended = 0  # parts this object appended: every _INDEX_EVERY-th one indexes the summaries

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, exist_ok: bool = False,
               storage_options: dict[str, Any] | None = None, source: str = "rlgen",
               notes: Sequence[str] = ()) -> RolloutLog:
        """A new, empty log at `path`; with `exist_ok=True` an existing log is opened instead.
        `source` and `notes` say where its rows come from (importers set them).

        Raises:
            LogError: a log is there (and not `exist_ok`), or the folder holds other files.
        """
        store = open_store(path, storage_options=storage_options)
        if store.exists(_MARKER):
            if exist_ok:
                return cls(path, storage_options=storage_options)
            raise LogError(f"a rollout log is already at {store.url}: open it with rlgen.RolloutLog({store.url!r}), "
                           "or pass exist_ok=True", path=store.url)
        if store.list():
            raise LogError(f"{store.url} holds other files: give a new or empty folder for the log", path=store.url)
        info = {"format": _FORMAT, "version": _VERSION, "rlgen": __version__, "source": source,
                "created": dt.datetime.now(dt.timezone.utc).isoformat(), "notes": list(notes)}
        store.write_new(json.dumps(info, indent=1).encode(), _MARKER)
        return cls(path, storage_options=storage_options)

    @classmethod
    def from_trl(cls, folder: str | os.PathLike[str], path: str | os.PathLike[str], *, tokenizer: Any,
                 dataset: Any = None, dataset_prompt: str = "prompt",
                 reward_columns: Sequence[str] | None = None, reward_weights: dict[str, float] | None = None,
                 max_completion_length: int | None = None, num_generations: int | None = None,
                 storage_options: dict[str, Any] | None = None) -> RolloutLog:
        """A new log at `path` holding a TRL run's completion logs (`log_completions=True`; `folder`:
        its output_dir), a part per logged step.

        TRL logs text only: the rows are tokenized with `tokenizer` (a tokenizer, or a local path or
        name) and marked `retokenized` (no logprobs), unless a reward function logged a
        `completion_ids` column through `log_extra`. `dataset` (a DataFrame, a `datasets.Dataset`, a
        list of dicts, or a .json/.jsonl/.parquet path; the prompts in `dataset_prompt`) is joined on
        the prompt to bring back what TRL does not log (the answer): a join that matches no row, or
        prompts listed twice with different values (left unjoined), warn (`LogImportWarning`);
        `max_completion_length` marks rows that reached it as cut ("length"); other finish reasons
        are "unknown". `reward_weights`: GRPOConfig's, for the combined `reward`. A GRPO group is
        `num_generations` consecutive rows, as TRL forms them (a prompt twice in a step is two
        groups). Where `folder` holds the run's `training_args.bin` (`Trainer.save_model`, or a
        checkpoint's), the GRPOConfig in it gives `num_generations`, `max_completion_length` and
        `reward_weights` not passed; without it the group size is inferred. The logged advantage is
        recomputed over the groups and the rows where it differs are counted. The log's `notes` say
        what was matched, re-tokenized, checked and missing.

        Raises:
            LogError: `folder` is not a TRL run's output, in a layout this version does not know, or
                its rows do not divide into groups of `num_generations` rows of one prompt; a log is
                already at `path` (an import makes a new log: read that one, or give a new path).
            TypeError, ValueError, FileNotFoundError: `dataset` is not one of the forms above, or
                lacks the column `dataset_prompt`.
        """
        from ._import_trl import read_trl

        read = read_trl(folder, reward_columns=reward_columns, reward_weights=reward_weights,
                        num_generations=num_generations)
        return cls._imported("trl", path, read.steps, read.notes, tokenizer=tokenizer, dataset=dataset,
                             dataset_prompt=dataset_prompt, weights=read.weights if reward_weights is None else reward_weights,
                             max_completion_length=(read.max_completion_length if max_completion_length is None
                                                    else max_completion_length),
                             storage_options=storage_options)

    @classmethod
    def from_verl(cls, folder: str | os.PathLike[str], path: str | os.PathLike[str], *, tokenizer: Any,
                  dataset: Any = None, dataset_prompt: str = "prompt",
                  max_completion_length: int | None = None, storage_options: dict[str, Any] | None = None) -> RolloutLog:
        """A new log at `path` holding a verl run's rollout dumps (`folder`: its
        `trainer.rollout_data_dir`), a part per step: `score` as the logged reward, `gts` as
        `ground_truth`, the reward manager's fields as columns. Text only, as `from_trl`: rows are
        re-tokenized with `tokenizer` and marked `retokenized`; `dataset` is joined as there.

        Raises:
            LogError: `folder` is not a verl dump, or in a layout this version does not know; a log
                is already at `path`.
            TypeError, ValueError, FileNotFoundError: `dataset` is not one of the forms `from_trl`
                takes, or lacks the column `dataset_prompt`.
        """
        from ._import_verl import read_verl

        read = read_verl(folder)
        return cls._imported("verl", path, read.steps, read.notes, tokenizer=tokenizer, dataset=dataset,
                             dataset_prompt=dataset_prompt, weights=None, max_completion_length=max_completion_length,
                             storage_options=storage_options)

    @classmethod
    def _imported(cls, source: str, path: str | os.PathLike[str], steps: Sequence[TextStep], notes: list[str], *,
                  tokenizer: Any, dataset: Any, dataset_prompt: str, weights: dict[str, float] | None,
                  max_completion_length: int | None, storage_options: dict[str, Any] | None) -> RolloutLog:
        """A new log holding a framework's steps, with notes on what the import could not know.

        Raises:
            LogError: a log is already at `path` (an import never adds to or replaces one).
        """
        from ..client._tokenizer import load_tokenizer
        from ..core._progress import ProgressLine
        from ._text_rows import join_steps, text_result

        store = open_store(path, storage_options=storage_options)
        if store.exists(_MARKER):
            raise LogError(f"a rollout log is already at {store.url}: an import makes a new log, never adds to or "
                           f"replaces one; read that one with rlgen.RolloutLog({store.url!r}), or import into a new "
                           "path (delete the old log first to import again at this one)", path=store.url)
        # joined before the log exists: its notes say how many rows matched
        joined = None if dataset is None else join_steps(steps, dataset, on=dataset_prompt)
        tok = load_tokenizer(os.fspath(tokenizer)) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        notes = [*notes, *_import_notes(steps, tokenizer=tok, joined=joined,
                                        max_completion_length=max_completion_length)]
        log = cls.create(path, storage_options=storage_options, source=source, notes=notes)
        with ProgressLine(f"import {source}", total=len(steps), unit="step", show=None) as line:
            for rows in steps:
                log.append(rows.step, text_result(rows, tokenizer=tok, source=source, weights=weights,
                                                  max_completion_length=max_completion_length))
                line.advance(1)
        return log

    # -- what it holds ----------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The log's folder or URL."""
        return self._store.url

    @property
    def source(self) -> str:
        """Where the rows came from: "rlgen" (appended by a loop), "trl", "verl" (imported)."""
        return str(self._info.get("source", "rlgen"))

    @property
    def notes(self) -> list[str]:
        """What an importer wants a reader to know (re-tokenized rows, unmatched answers, ...)."""
        return list(self._info.get("notes", []))

    def _parts(self, steps: Steps = None, *, name: str | None = None) -> list[PartName]:
        """The parts of `steps`: a few steps are listed by their name prefix (on S3 a listing of
        those steps' parts only), more by one listing of the folder."""
        wanted = _step_set(steps)
        if wanted is not None and len(wanted) <= _PREFIX_STEPS:
            files = [f for s in sorted(wanted) if s >= 0 for f in self._store.list(PARTS, prefix=step_prefix(s))]
        else:
            files = self._store.list(PARTS)
        parts = sorted(p for f in files if (p := PartName.parse(f)) is not None)
        return [p for p in parts if (wanted is None or p.step in wanted) and (name is None or p.name == name)]

    @property
    def steps(self) -> list[int]:
        """The steps that have at least one part, in order."""
        return sorted({p.step for p in self._parts()})

    def missing_steps(self) -> list[int]:
        """Steps absent from the log's stride (TRL logs every `logging_steps`-th step): between the
        first and last step, at the stride of the logged steps (see `_stride`). Nothing is interpolated."""
        steps = self.steps
        stride = _stride(steps)
        return [] if stride is None else sorted(set(range(steps[0], steps[-1] + 1, stride)) - set(steps))

    def parts(self) -> pd.DataFrame:
        """One row per part: step, name, rows, file."""
        import pandas as pd

        parts = self._parts()
        return pd.DataFrame({"step": [p.step for p in parts], "name": [p.name for p in parts],
                             "rows": [self._cache.num_rows(self._store, p.file) for p in parts],
                             "file": [p.file for p in parts]})

    def __len__(self) -> int:
        return sum(self._cache.num_rows(self._store, p.file) for p in self._parts())

    # -- writing -----------------------------------------------------------------------------------
    def append(self, step: int, res: Rollouts, *, name: str = "main") -> str:
        """Log `res` (a Rollouts or Episodes, with its rewards) as step `step`'s part `name`; returns
        the part's file name. The part becomes visible only once completely written. Its summary
        (`summaries/<part>.json`: what `trend` needs of its rows) is written just before it.

        Of writers appending one (step, name) at once, exactly one succeeds: each first claims it
        (`claims/step-<step>.<name>.claim`, created by one writer only, locally O_EXCL, on S3 a
        conditional PUT), and only the claim's winner writes the part. Every 256th part a log object
        appends, it also gathers the summaries no index holds yet into one index file (`trend` on an
        object store then GETs a few files, not one a part). A writer killed between the
        claim and a complete part leaves the claim: the next append of that (step, name) is refused
        with the claim's file, who made it and when; remove it to log the step again.

        Raises:
            LogError: step `step` already has a part `name`, or another writer holds its claim (a log
                never merges or replaces rows: give another `name` for a second call at one step,
                e.g. name="eval").
            TypeError: `res` is not a result.
        """
        if not isinstance(res, Rollouts):
            raise TypeError(f"append takes a result (rlgen.Rollouts or Episodes), got {type(res).__name__}")
        part = PartName.new(step, name)
        data = part_bytes(res, step)  # first: a result that cannot be written claims nothing
        summary = _summary_bytes(res)
        self._refuse_taken(part, claimed=False)
        if not self._store.claim(claim_record(part), CLAIMS, part.claim_file):
            self._refuse_taken(part, claimed=True)
        try:  # the summary first: a reader uses a summary only for a part that exists
            self._store.write_new(summary, SUMMARIES, part.summary_file)
            self._store.write_new(data, PARTS, part.file)
        except BaseException:
            if not self._store.exists(PARTS, part.file):  # the claim goes only with a part never written
                self._store.remove(SUMMARIES, part.summary_file)
                self._store.remove(CLAIMS, part.claim_file)
            raise
        self._appended += 1
        if self._appended % _INDEX_EVERY == 0:
            self._index_quietly()
        return part.file

    def _index_quietly(self) -> None:
        """Gather the summaries no index holds yet into one index file (`write_index`), so a reader
        GETs one file for them (on an object store, not one a part); a failure only warns: the part
        is written, and the summaries are still read one by one."""
        try:
            write_index(self._store, self._parts())
        except (OSError, LogError) as err:
            warnings.warn(f"the summaries of {self._store.url} were not indexed ({err}); trend() reads them one by "
                          "one, slower on object storage: call log.write_summaries() to index them", stacklevel=3)

    def _refuse_taken(self, part: PartName, *, claimed: bool) -> None:
        """LogError where (step, name) has a part; where `claimed` (another writer holds the claim)
        in any case, saying whose claim it is and what to do."""
        step, name = part.step, part.name
        same = [p.file for p in self._parts(step, name=name)]
        if same:
            raise LogError(f"step {step} already has a part {name!r} ({same[0]}); a log never merges or replaces "
                           f"rows: log a second call at this step with another name, e.g. append({step}, res, "
                           "name='eval')", path=self._store.path(PARTS, same[0]))
        if not claimed:
            return
        path = self._store.path(CLAIMS, part.claim_file)
        who = self._store.read_json(CLAIMS, part.claim_file) or {}
        by = (f" by pid {who.get('pid')} on {who.get('host')} at {who.get('claimed')}, for {who.get('part')}"
              if who else "")
        raise LogError(f"step {step}'s part {name!r} is claimed{by} and not written yet: another process is appending "
                       "it now (this call is the second: log this call under another name, e.g. name='eval'), or "
                       "that writer was killed mid-append; if no process is appending it, delete the claim "
                       f"{path} and append again", path=path)

    # -- reading -----------------------------------------------------------------------------------
    def rows(self, *, steps: Steps = None, columns: Sequence[str] | None = None, rewards: str | None = None) -> pd.DataFrame:
        """The rows of `steps` (None: all) as one DataFrame of `columns` (None: every column but token
        data), with `part` and `row` (a row's position in its part). `rewards`: also the columns of
        that reward version (`logged` is in the rows already). Reads only what is asked for; columns
        read once are kept (parts never change). A part that cannot be read is left out, with a
        warning naming its file."""
        wanted = None if columns is None else list(dict.fromkeys(["step", "prompt_index", *columns]))
        parts = self._parts(steps)
        df = read_light(self._store, self._cache, parts, wanted)
        if rewards is not None and rewards != LOGGED:
            version = read_version(self._store, rewards, parts, df)
            df = df.join(version.add_prefix(f"{rewards}:"))
        return df

    def load(self, steps: Steps = None, *, name: str | None = None, tokenizer: Any = None) -> Rollouts:
        """The rows of `steps` (a step, a range, a list; None: all) as one result, with tensors and
        views: a `Rollouts`, or `Episodes` for a log of episodes. `name`: only parts of that name;
        `tokenizer`: for the token text of the views (default: the log's, else the one each part names).

        Raises:
            LogError: no part matches, or a part cannot be read (its file named).
        """
        parts = self._parts(steps, name=name)
        if not parts:
            raise LogError(f"no part of this log is at steps {steps!r}" + (f" named {name!r}" if name else "")
                           + f"; its steps: {_span(self.steps)}", path=self.path)
        results = read_full(self._store, parts, Rollouts, tokenizer=tokenizer if tokenizer is not None else self._tokenizer)
        return results[0] if len(results) == 1 else type(results[0]).concat(results)

    def load_rows(self, rows: pd.DataFrame) -> Rollouts:
        """The rows a frame names by `part` and `row` (e.g. `diff.changed`), as one result in the
        frame's order, with the frame's other columns added (both scores of a diff, say). Reads
        only the parts those rows are in."""
        import numpy as np

        if not {"part", "row"} <= set(rows.columns) or not len(rows):
            raise ValueError("rows must be a non-empty frame with 'part' and 'row' columns (from log.rows(), a diff)")
        by_file = {p.file: p for p in self._parts()}
        unknown = sorted(set(rows["part"]) - set(by_file))
        if unknown:
            raise LogError(f"rows name parts this log does not have: {unknown[:3]}", path=self.path)
        files = list(dict.fromkeys(rows["part"]))
        loaded = read_full(self._store, [by_file[f] for f in files], Rollouts, tokenizer=self._tokenizer)
        wanted = [rows.loc[rows["part"] == f, "row"].astype(int).tolist() for f in files]
        picked = [whole[positions] for whole, positions in zip(loaded, wanted)]
        res = picked[0] if len(picked) == 1 else type(picked[0]).concat(picked, renumber=True)
        # concat holds the rows part by part; the frame's order is each row's place among them
        place = {(f, r): k for k, (f, r) in enumerate((f, r) for f, positions in zip(files, wanted) for r in positions)}
        res = res[[place[(f, int(r))] for f, r in zip(rows["part"], rows["row"])]]
        extra = [c for c in rows.columns if c not in res.df.columns and c not in ("part", "row")]
        columns = {c: rows[c].tolist() for c in extra}
        columns.update({"log_part": rows["part"].tolist(), "log_row": np.asarray(rows["row"], dtype=np.int64).tolist()})
        loaded_rows: Rollouts = res.with_columns(columns)
        return loaded_rows

    def browse(self, *, step: int | None = None, reward: str = "reward", widgets: bool | None = None) -> LogBrowser:
        """A browser over the log a step at a time (a slider over the logged steps; previous / next),
        each step in the rollout browser (filters, groups, token heatmaps). Only the shown step is
        read. `step`: the one to open at (default the first)."""
        from ._browser import LogBrowser

        return LogBrowser(lambda s: self.load(s), self.steps, step=step, reward=reward, widgets=widgets)

    # -- reward versions ---------------------------------------------------------------------------
    def versions(self) -> pd.DataFrame:
        """One row per reward version: `logged`, then each re-score, with its functions (name and
        source hash), options, repeats, when, and how many parts it has scored."""
        import pandas as pd

        from ._versions import scored_parts

        rows: list[dict[str, Any]] = [{"version": LOGGED, "functions": "as the run logged them", "created": None,
                                       "parts": len(self._parts())}]
        for name in version_names(self._store):
            info = read_lineage(self._store, name)
            rows.append({"version": name, "functions": ", ".join(f"{f['name']} ({f['source_sha256'][:12]})"
                                                                  for f in info["functions"]),
                         "options": info["options"], "repeats": info["repeats"], "created": info["created"],
                         "parts": len(scored_parts(self._store, name))})
        return pd.DataFrame(rows)

    def lineage(self, version: str) -> dict[str, Any]:
        """A re-scored version's lineage: functions (name, source SHA-256, source, parameters),
        options, repeats, created, rlgen version."""
        return read_lineage(self._store, version)

    @takes_options(RescoreOptions)
    def rescore(self, funcs: RewardFunctions, /, **options: Unpack[RescoreOptions]) -> str:
        """Score the log's rows again with `funcs` (every style `add_rewards` takes, run the same way:
        worker processes, timeouts, per-row statuses) and append the scores as a new reward version,
        named `version=` (default: the functions' names joined by '+'); returns its name.

        Nothing is overwritten: the rows keep their logged rewards and every earlier version. Scoring
        again under a version's name with the same functions scores only the parts it has not scored
        yet (new steps, a call that was interrupted); with edited functions it is refused: pick a
        new name. `repeats=k` scores each row k times (a stochastic judge): `rewards(version)` then
        has each row's mean and `reward_std`.

        Raises:
            LogError: the version name is taken by other functions or options.
        """
        from ._rescore import rescore

        opts = resolve(RescoreOptions, options)
        name, _ = rescore(self._store, self._cache, self._parts(opts["steps"]), funcs, opts)
        return name

    def rewards(self, version: str = LOGGED, *, steps: Steps = None) -> pd.DataFrame:
        """Each row's scores under a version (`part`, `row`, `step`, then the version's columns:
        per-function values and statuses, `reward`, group columns); NaN where not scored."""
        parts = self._parts(steps)
        if version == LOGGED:  # the reward columns of the parts, read alone (their names from the footers)
            return read_light(self._store, self._cache, parts, ["step", *logged_columns(self._cache.names(self._store, parts))])
        read_lineage(self._store, version)  # LogError naming the versions there are
        rows = read_light(self._store, self._cache, parts, ["step"])
        return rows.join(read_version(self._store, version, parts, rows))

    def diff(self, a: str = LOGGED, b: str | None = None, *, steps: Steps = None, reward: str = "reward",
             threshold: float = 1.0, confidence: float = 0.9, interval: str = "t") -> RewardDiff:
        """Two reward versions side by side (default: `logged` against the newest re-score): the rows
        whose score changed, the prompt groups that start or stop carrying a GRPO gradient, each
        row's advantage under both, per step the means, pass rates (reward >= `threshold`) and their
        paired difference with an interval over prompt groups, and the first step where the two part
        ways. See `rlgen.compare.RewardDiff`.

        Only rows both versions scored are compared: the steps a re-score has not reached (yet) are
        left out, and the diff's `notes` say which steps and how many rows.

        Raises:
            LogError: no re-scored version (and `b` not given), a version that does not exist, or no
                row scored under both versions.
        """
        from ..compare._reward_diff import reward_diff

        names = version_names(self._store)
        if b is None:
            if not names:
                raise LogError("this log has no re-scored version yet: log.rescore(fn, version='strict') first")
            b = names[-1]
        light = ["step", "prompt_index", "prompt_key", "prompt", "completion", "finish_reason", "completion_tokens",
                 "prompt_messages"]
        rows = self.rows(steps=steps, columns=light)
        scores = [self.rewards(v, steps=steps).loc[:, lambda d: [c for c in d.columns if c not in ("part", "row", "step")]]
                  for v in (a, b)]
        both, notes = _scored_by_both(self._store, rows, (a, b))
        rows, scores = rows[both], [s[both] for s in scores]
        if "prompt_messages" in rows.columns:  # a chat's last user message reads better than its template
            rows["prompt"] = [_last_user(m, p) for m, p in zip(rows.pop("prompt_messages"), rows["prompt"])]
        return reward_diff(rows, scores[0].set_axis(rows.index), scores[1].set_axis(rows.index), names=(a, b),
                           reward=reward, threshold=threshold, confidence=confidence, interval=interval,
                           loader=self.load_rows, notes=notes)

    # -- views -------------------------------------------------------------------------------------
    def trend(self, *, version: str = LOGGED, steps: Steps = None, reward: str = "reward",
              threshold: float = 1.0) -> pd.DataFrame:
        """One row per step: rows, mean `reward` under `version` and its pass rate (>= `threshold`),
        mean completion length, the share of each finish reason, and the share of prompt groups
        with zero variance (no GRPO gradient). The logged `reward` at `threshold` 1.0 comes from
        the parts' summaries (one small file a part, written by `append`); a part without one (a log
        written before rlgen kept summaries; `write_summaries` adds them) or another threshold has
        its five light columns read; another version or reward column: four, and its scores."""
        from ._views import trend_table

        if version == LOGGED and reward == "reward":
            return self._summary_trend(steps, threshold)
        light = ["step", "prompt_index", "completion_tokens", "finish_reason"]
        # The logged reward is a column of the parts: one read of five columns (bench/run_log.py).
        rows = self.rows(steps=steps, columns=[*light, reward] if version == LOGGED else light)
        scores = rows if version == LOGGED else self.rewards(version, steps=steps)
        if reward not in scores.columns:
            raise LogError(f"version {version!r} has no column {reward!r}; its columns: {list(scores.columns)}")
        return trend_table(rows, scores[reward].to_numpy(dtype=float), threshold=threshold)

    def _summary_trend(self, steps: Steps, threshold: float) -> pd.DataFrame:
        """The logged reward's trend from the parts' summaries, a part without one (or with another
        threshold) summarised from its rows here; exactly `trend_table` on the same rows."""
        from ._views import part_summary, summary_trend, trend_table

        parts = self._parts(steps)
        found = read_summaries(self._store, parts)
        usable = {f: s for f, s in found.items() if s.get("summary") == _SUMMARY and s.get("threshold") == threshold}
        rest = [p for p in parts if p.file not in usable]
        if rest:
            rows = read_light(self._store, self._cache, rest, ["step", "prompt_index", "completion_tokens",
                                                               "finish_reason", "reward"])
            if not usable and "reward" in rows.columns:  # no summary at all (an old log): the table at once
                return trend_table(rows, rows["reward"].to_numpy(dtype=float), threshold=threshold)
            if "reward" not in rows.columns:
                rows["reward"] = float("nan")
            for file, part_rows in rows.groupby("part", sort=False):
                usable[str(file)] = part_summary(part_rows, part_rows["reward"].to_numpy(dtype=float),
                                                 threshold=threshold)
        pairs = [(p.step, usable[p.file]) for p in parts if p.file in usable]
        if any(s["reward"] is None for _, s in pairs):
            raise LogError("version 'logged' has no column 'reward' in some parts: trend(reward=...) names another")
        return summary_trend(pairs)

    def write_summaries(self, *, index: bool = True) -> int:
        """Write the summary of every part that lacks one (a log written before rlgen kept them),
        each create-only, so `trend` reads summaries instead of the parts' columns; returns how many
        were written. With `index`, then gather the summaries no index holds yet into one new index
        file (`summaries/index-<id>.json`): on an object store `trend` then GETs that one file, not
        one a part (`append` does this itself every 256 parts it writes; call it for a log written
        by another tool, or before rlgen indexed).
        Safe while a run appends, and to run twice: nothing is replaced."""
        from ._parts import summarised, write_index
        from ._views import part_summary

        have = summarised(self._store)
        parts = self._parts()
        rest = [p for p in parts if p.file not in have]
        written = 0
        for start in range(0, len(rest), 256):  # a batch at a time: the rows of all parts at once may not fit
            batch = rest[start:start + 256]
            rows = read_light(self._store, LightCache(), batch, ["step", "prompt_index", "completion_tokens",
                                                                 "finish_reason", "reward"])
            by_file = dict(iter(rows.groupby("part", sort=False)))
            for part in batch:
                if part.file not in by_file:
                    continue  # unreadable: read_light warned
                part_rows = by_file[part.file]
                values = part_rows["reward"].to_numpy(dtype=float) if "reward" in part_rows.columns else None
                summary = part_summary(part_rows, values, threshold=1.0)
                written += self._store.create(json.dumps(summary).encode(), SUMMARIES, part.summary_file)
        if index:
            write_index(self._store, parts)
        return written

    @property
    def plot(self) -> LogPlots:
        """Plots of the log: `log.plot.trend()`."""
        from ._views import LogPlots

        return LogPlots(self)

    def prompt(self, key: str, *, columns: Sequence[str] = ("completion", "reward", "finish_reason", "completion_tokens")) -> pd.DataFrame:
        """One prompt's samples across steps: a prompt key (or the start of one, or the prompt's
        text) -> its rows, by step."""
        rows = self.rows(columns=["prompt_key", "prompt", *columns])
        mask = rows["prompt_key"].astype(str).str.startswith(key) | (rows["prompt"].astype(str) == key)
        if not mask.any():
            raise LogError(f"no row has prompt key or text {key!r}; keys look like {rows['prompt_key'].iat[0]!r}"
                           if len(rows) else "this log has no rows yet")
        return rows[mask].sort_values(["step", "part", "row"]).reset_index(drop=True)

    def sql(self, query: str) -> pd.DataFrame:
        """Run SQL (DuckDB, `pip install 'rlgen[sql]'`) over the log's light columns, as the table
        `rows`; returns pandas. E.g. `log.sql("select step, avg(reward) from rows group by step")`."""
        from ._views import run_sql

        return run_sql(self.rows(), query)

    def __repr__(self) -> str:
        steps = self.steps
        return (f"RolloutLog({self.path!r}: {len(self._parts())} parts, steps {_span(steps)}, "
                f"reward versions {[LOGGED, *version_names(self._store)]}, source {self.source!r})")

    def _repr_html_(self) -> str:
        from ._views import log_html

        return log_html(self)


def _summary_bytes(res: Rollouts) -> bytes:
    """A result's summary (`_views.part_summary` at threshold 1.0) as the JSON `append` writes."""
    from ._views import part_summary

    df = res.df
    reward = df["reward"].to_numpy(dtype=float) if "reward" in df.columns else None
    return json.dumps(part_summary(df, reward, threshold=1.0)).encode()


def _import_notes(steps: Sequence[TextStep], *, tokenizer: Any, joined: list[str] | None,
                  max_completion_length: int | None) -> list[str]:
    """What an import says it could not know, in the log's notes (`joined`: the dataset join's
    notes, None without a dataset); the rows are re-tokenized here, once (`_text_rows.prepare_rows`)."""
    from ._text_rows import prepare_rows

    notes = prepare_rows(steps, tokenizer=tokenizer, joined=joined, max_completion_length=max_completion_length)
    logged = sorted(s.step for s in steps)
    stride = _stride(logged)
    if stride is not None and stride > 1:
        notes.append(f"steps logged: {len(logged)} ({logged[0]}..{logged[-1]}); the run logged one step in "
                     f"{stride}: the others are missing, not interpolated")
    return notes


def _stride(steps: Sequence[int]) -> int | None:
    """The logging stride of sorted steps: the greatest common divisor of the gaps between them,
    the last gap left out where there are others (a trainer logs its last step whether or not it
    is on the stride: TRL's 10, 20, 25 is a stride of 10). None below three steps."""
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    if len(gaps) < 2:
        return None
    return math.gcd(*gaps[:-1])


def _scored_by_both(store: Store, rows: pd.DataFrame, versions: tuple[str, str]) -> tuple[Any, list[str]]:
    """Which of `rows` (with `part` and `step`) both versions scored (`logged`: every row; a
    re-score: the parts it has scores of), and a note per version on the rows it left out.

    Raises:
        LogError: no row is scored under both.
    """
    import numpy as np

    both = np.ones(len(rows), dtype=bool)
    notes = []
    for version in dict.fromkeys(v for v in versions if v != LOGGED):
        scored = rows["part"].isin(scored_parts(store, version)).to_numpy(dtype=bool)
        if not scored.all():
            steps = sorted({int(s) for s in rows.loc[~scored, "step"]})
            notes.append(f"left out: {int((~scored).sum())} rows of step{'s' if len(steps) > 1 else ''} "
                         f"{_steps_text(steps)}, not scored under {version!r} (log.rescore with its functions and "
                         f"version={version!r} goes on where it stopped)")
        both &= scored
    if not both.any():
        raise LogError(f"no row is scored under both {versions[0]!r} and {versions[1]!r}: " + "; ".join(notes))
    return both, notes


def _steps_text(steps: Sequence[int]) -> str:
    """Steps in runs: "2, 5-9, 12" (runs of consecutive steps as first-last), cut after 12 runs."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    text = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return ", ".join(text[:12]) + (f", ... ({len(steps)} steps)" if len(text) > 12 else "")


def _last_user(messages: Any, prompt: str) -> str:
    """A chat row's last user message (`read_light` decodes the messages); the prompt otherwise."""
    users = [m for m in messages if m.get("role") == "user"] if isinstance(messages, list) else []
    return str(users[-1]["content"]) if users else prompt


def _step_set(steps: Steps) -> set[int] | None:
    if steps is None:
        return None
    if isinstance(steps, int) and not isinstance(steps, bool):
        return {steps}
    if isinstance(steps, (range, list, tuple)) and all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
        return set(steps)
    raise TypeError(f"steps must be None (every step), a step, a range or a list of steps; got {steps!r}"[:300])


def _span(steps: Sequence[int]) -> str:
    if not steps:
        return "none yet"
    return f"{steps[0]}..{steps[-1]} ({len(steps)} logged)"
