"""Off-policy generation (issue 46): a job that spans a weight push, the pause around the push, the
trainer's logprobs of the rollouts against one forward pass, and the sampler-trainer mismatch with
SGLang's deterministic inference off and on.

Not a test. Starts ONE server for phases span and trainer (phase deterministic: one per arm) with `rlgen.Engine(model, backend=...)` (on SGLang with the site flags,
`_common.site_flags()`, and `--gpu-memory-fraction` (0.5) of the GPU, so the trainer fits beside it)
and loads the trainer in this process: `transformers.AutoModelForCausalLM.from_pretrained(model)`,
bf16 on the GPU when there is one (the server's GPU: SGLang maps the pushed tensors by CUDA IPC),
else float32 on the CPU, on one thread (beside the CPU server's process on a 2-core machine, torch's
OpenMP threads spinning against it made the same forward pass take 0.3-6.6 s). The trainer holds the weights the server serves, so a push sends tensors of
the served names and shapes; before every push one tensor (the first 2-D weight of layer 0) is set to
the checkpoint's x 1.01 (odd pushes) or back to the checkpoint's (even pushes): each push changes the
served weights for real, and they never drift. `--push model` (SGLang's default) sends the whole
state dict (`eng.update_weights(trainer)`); `--push tensor` (the CPU backend's default: it gets
tensors by value, ~8 s for the whole 135M model on a small machine) sends that one tensor.

Workload: `--prompts` (256; 4 with --quick) one-turn chat prompts from _common's templates, rendered
once with the model's chat template to token ids; each sampled to exactly `--max-new-tokens` (512; 16
with --quick) tokens (ignore_eos), temperature 1.0, logprobs on; `eng.submit(ids, ...)`: one job,
one batched request (n=1, rlgen's chunking). Every job streams a chunk every k = ceil(push_at x
max_new_tokens) tokens (`sampling_params={"stream_interval": k}`; a job's default is two chunks per
request, its first token and its end), so that the tokens sampled so far can be seen, and the
trigger below fires as the samples pass k tokens.

Phase `span` (`--phases`). Methods, each once as a warm-up (with --quick: `none` and `push` only),
then `--repeats` (5; 2 with --quick) rounds, each running every method once in a shuffled order
(`random.Random(0)`, a fresh shuffle a round), each run after `eng.flush_cache()` and a GC collection:

    none       the job alone: eng.submit(...), then job.result(); timed from submit to the result
    abort      the same job; this thread polls it (every 5 ms) until the tokens it has sampled (its
    retract    answered requests' tokens, `job.progress.tokens`, plus the tokens its requests in
    in_place   flight have streamed) reach --push-at (0.3) of N x max_new_tokens, then calls
               `eng.update_weights(trainer, pause=mode)`, timed alone (`update_s`: pause + push +
               continue, as the caller waits for it: it includes the wait for the server to reach
               the pause, during which the job still samples), then job.result(); `none` runs the
               same polling and notes when it would have pushed
    push       the push alone, no job running (`eng.update_weights(trainer)`: no pause): the push time

Per run (all in the JSON): wall seconds, tokens, tokens/s, update_s, the trigger (seconds after
submit, tokens streamed, samples done), the version index before and after, tokens by version (a
bincount of `res.versions` over the response tokens), n_segments and num_retractions (mean, max,
sum), kv_staleness counts, finish reasons, and re-prefilled tokens: under abort, each continuation
request's prompt + tokens so far (exact, from `meta_info["segments"]`); under retract, num_retractions
x (prompt + old-version tokens) per row (a lower bound: the old-version count is what had streamed
before the pause). Checks (a failed one makes the run wrong, and a target its run feeds FAILs):
tokens == sum over versions == N x max_new_tokens; every token has a version and a row's versions
never go back; `none`: every token the version before; a mode: every token the version before or
the one its push made (+1, the Engine's index after), and every row that was not done at the push
ends on the new version (its last tokens were sampled after the push); the push made exactly one
version.

Phase `trainer`: one job's rollouts of the same prompts x max_new_tokens (no push, checked as
`none`), then one warm-up of each and `--repeats` rounds in a shuffled order of

    sampler_vs_trainer  rlgen.sampler_vs_trainer(res, trainer, batch_size=--batch-size (32; 4 with
                        --quick), progress=False): the trainer's logprobs of every sampled token
                        (each batch cut to its own longest prompt and response, logits of the
                        response positions only, float32 log_softmax) and the comparison
    forward             one forward pass of the same batch: trainer(input_ids=res.input_ids,
                        attention_mask=res.attention_mask, use_cache=False) under torch.no_grad()
                        (no KV cache: a training forward builds none; at 1.7B it would be ~28 GB),
                        all N rows at once; if that is out of memory, in chunks of --batch-size
                        rows, and the record says so (`forward.chunk`)

each timed between torch.cuda.synchronize() calls, with its peak GPU memory. The mismatch summary
(`SamplerMismatch.summary`: verl's and TRL's numbers: k3_kl, log_ppl_diff, sampling_logp_difference,
the TIS and MIS fractions; SGLang bf16 against transformers) is recorded from the last run.

Phase `deterministic` (not in the default `--phases`): how much of the sampler-trainer mismatch
SGLang's `--enable-deterministic-inference` removes, and what it buys run to run. It closes the
server span and trainer share (started again if a later phase needs it) and runs two arms, `off` then
`on`, each on a server of its own, started as above with `--enable-deterministic-inference` after the
bench's own flags for `on`. On `--backend cpu` only `off` runs and `on` is recorded as skipped, with
the reason: rlgen.cpu_server has no deterministic mode (it does not define the flag; it warns about
and ignores unknown flags, so an `on` arm would be the `off` arm again; its sampling honours
sampling_seed always). Per arm: the prompts above x max_new_tokens (ignore_eos), temperature 1.0,
logprobs on, `seed=1234` (SGLang's sampling_seed, honoured only in deterministic mode), one job
after a cache flush, then the same batch again after another flush; the server is closed; then
`rlgen.sampler_vs_trainer(first batch, trainer, batch_size=--batch-size)` against the trainer the
other phases use (loaded once, after the first server is up; set back to the checkpoint's weights,
what a fresh server serves). Recorded per arm (`deterministic.arms.<arm>`): `start_s` (the server's
start, Engine() to ready), `batch` (seconds, tokens, tok/s of the first batch), `mismatch`: tokens
compared, abs_log_ratio_mean / _max (mean and max |log r| over them, log r = lp_trainer -
lp_sampler), k3_kl (mean k3), tis_token_clip_fraction (share of tokens with r > 2, the TIS cap) and
mis_token_mask_fraction (r outside [0.5, 2], the MIS bounds), at sampler_vs_trainer's defaults,
with the whole summary and the scoring seconds; `rerun` (the second batch's timing and
`run_to_run`): identical_ids (every row's sampled ids and length the same), rows_identical,
tokens_differing, and max_abs_logprob_diff / mean_ (|logprob first - second| over each row's
positions up to its first differing token: the same token after the same prefix). Reported: a row
per arm, "mismatch removed by deterministic mode: X% of mean |log r|" (1 - on / off; n/a when an arm
did not run), and the run-to-run lines. A measurement: no target, no verdict. --budget-s: the `on`
arm is not started (recorded as skipped) once the `off` arm's wall time would end past the budget.

Targets (issue 46: H200 (H100 allowed), 1.7B, side by side in one run), each judged on a 90%
percentile bootstrap interval (4,000 draws, seed 0; each run set resampled on its own) with
`_common.Targets.check_interval`: PASS if the whole interval is on the good side of the bound, FAIL
if all of it is on the wrong side, NOISE if it straddles it, n/a below 3 runs a side; a wrong run
makes it FAIL:

    per mode  extra = median(mode s) - median(none s) (`compare_difference`, reported with its
              interval) against push + 10%: judged on excess = median(mode s) - median(none s) -
              (median(push s) + 0.1 x median(none s)), one interval resampling the three run sets
              (mode, none, push) together: PASS if its upper end < 0 s. The same job's tokens/s
              then loses at most the push time plus 10% (its tokens are equal in every run)
    per mode  pause-to-continue: median(update_s of the mode) - median(update_s of push alone)
              (`compare_difference` on update_s): PASS if its upper end < 0.05 s
    trainer   median(sampler_vs_trainer s) / median(forward s) (`compare`): PASS if its upper end < 2

Reported beside them, not judged: the fastest mode (lowest median wall, each median with its
interval, and whether the interval of the next one's difference to it excludes 0) and why, from the
numbers: per mode the extra seconds split into the update call and the rest after it (negative where
the update call's wait overlapped sampling: the CPU backend pauses at its next decode step), and what the
rest is (abort: re-prefill of every continuation; retract: retracted requests' KV recomputed;
in_place: nothing recomputed, old-weight KV kept); tokens/s ratios to none.

`--budget-s`: stop starting rounds of a phase once the longest round so far would end past this many
seconds since the script started (a part under a `timeout` still ends with its report); the record
says which phase was cut short. Every run is saved as it ends; the report is printed at the end
(`--report-only JSON` prints it again from a saved run).

    python bench/offpolicy.py --backend sglang --out offpolicy.json                    # the GPU machine
    python bench/offpolicy.py --backend sglang --model /tmp/ckpt/llama-1.7b --phases trainer,span --out o.json
    python bench/offpolicy.py --backend cpu --quick --out /tmp/offpolicy.json          # smoke test anywhere
    python bench/offpolicy.py --backend sglang --phases deterministic --out det.json        # off vs on
    python bench/offpolicy.py --report-only offpolicy.json --out again.json
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import _common as C

REPEATS = 5
PHASES = ("span", "trainer", "deterministic")
DEFAULT_PHASES = ("span", "trainer")
MODES = ("abort", "retract", "in_place")
SPAN_METHODS = ("none", *MODES, "push")
TRAINER_METHODS = ("sampler_vs_trainer", "forward")
DETERMINISTIC_ARMS = ("off", "on")
DETERMINISTIC_FLAG = "--enable-deterministic-inference"
DETERMINISTIC_SEED = 1234
CPU_SKIP = ("the CPU backend has no deterministic mode: rlgen.cpu_server does not define "
            "--enable-deterministic-inference (it warns about and ignores unknown flags, so an 'on' arm would be the "
            "off arm again); its sampling honours sampling_seed always")
SIZES = {"full": {"prompts": 256, "max_new_tokens": 512, "batch_size": 32},
         "quick": {"prompts": 4, "max_new_tokens": 16, "batch_size": 4}}
SCALE = 1.01              # the perturbed tensor on odd pushes (x 1.001 would mostly round back in bf16)
PUSH_SHARE_BOUND = 0.10   # a mode's job may lose the push time + this share of the none job's time
PAUSE_BOUND_S = 0.05      # pause-to-continue may exceed the push alone by this much
TRAINER_BOUND = 2.0       # trainer logprobs / one forward pass
POLL_S = 0.005


# ---------------------------------------------------------------------------------------------
# The trainer and its pushes


class Trainer:
    """The trainer's model (the served weights), the one tensor each push perturbs, and the pushes."""

    def __init__(self, model: str, push: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":  # beside the CPU server's process: one thread, no OpenMP spinning against it
            torch.set_num_threads(1)
        self.dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        t0 = time.monotonic()
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=self.dtype).to(self.device)
        self.model.eval()
        self.load_s = time.monotonic() - t0
        self.name, self.param = next((n, p) for n, p in self.model.named_parameters()
                                     if p.ndim == 2 and ".layers.0." in n)
        self.original = self.param.detach().clone()
        self.push_what, self.pushes, self.in_sync = push, 0, True

    def summary(self) -> dict[str, Any]:
        return {"device": self.device, "dtype": str(self.dtype), "load_s": self.load_s, "perturbed": self.name,
                "perturbed_shape": list(self.param.shape), "scale": SCALE, "push": self.push_what,
                "parameters": sum(p.numel() for p in self.model.parameters())}

    def restore(self) -> None:
        """Hold the checkpoint's weights again (what a freshly started server serves); the next push
        perturbs."""
        import torch

        with torch.no_grad():
            self.param.copy_(self.original)
        self.pushes += self.pushes % 2
        self.in_sync = True

    def push(self, eng: Any, pause: str | None) -> tuple[float, str]:
        """Perturb (or restore) the tensor, push, and return (the update call's seconds, the version)."""
        import torch

        self.pushes += 1
        with torch.no_grad():
            self.param.copy_(self.original * SCALE if self.pushes % 2 else self.original)
        self.in_sync = False
        weights = self.model if self.push_what == "model" else {self.name: self.param}
        t0 = time.perf_counter()
        version = eng.update_weights(weights, pause=pause, progress=False)
        seconds = time.perf_counter() - t0
        self.in_sync = True
        return seconds, version


# ---------------------------------------------------------------------------------------------
# Span: a job, a push at push_at of its tokens


def streamed(job: Any) -> int:
    """The tokens the job has sampled so far (`progress.tokens`: its answered requests' and what its
    requests in flight have streamed, every `stream_interval` tokens)."""
    return int(job.progress.tokens)


def submit(eng: Any, prompts: list[list[int]], size: dict[str, Any]) -> Any:
    return eng.submit(prompts, max_new_tokens=size["max_new_tokens"], temperature=1.0, ignore_eos=True,
                      logprobs=True, progress=False, sampling_params={"stream_interval": size["stream_interval"]})


def job_run(eng: Any, trainer: Trainer, prompts: list[list[int]], size: dict[str, Any], mode: str | None
            ) -> dict[str, Any]:
    """One job (mode None: no push), timed from submit to its result, checked."""
    total = len(prompts) * size["max_new_tokens"]
    before = eng.version_index
    t0 = time.perf_counter()
    job = submit(eng, prompts, size)
    try:
        trigger: dict[str, Any] | None = None
        while not job.done():
            got = streamed(job)
            if got >= size["push_at"] * total:
                trigger = {"at_s": time.perf_counter() - t0, "streamed": got, "done": job.progress.done}
                break
            time.sleep(POLL_S)
        update_s = version = None
        if mode is not None:
            if trigger is None:
                trigger = {"at_s": time.perf_counter() - t0, "streamed": streamed(job), "done": job.progress.done,
                           "late": True}
            update_s, version = trainer.push(eng, mode)
        res = job.result()
    except BaseException:
        job.cancel()
        raise
    seconds = time.perf_counter() - t0
    run = {"seconds": seconds, "tokens": int(res.n_tokens), "tok_s": res.n_tokens / seconds, "update_s": update_s,
           "weight_version": version, "trigger": trigger, "version_before": before,
           "version_after": eng.version_index}
    run.update(job_details(res, before, eng.version_index, mode, trigger, expected=total))
    return run


def job_details(res: Any, before: int, after: int, mode: str | None, trigger: dict[str, Any] | None, *,
                expected: int) -> dict[str, Any]:
    """What a job's result says (versions, segments, retractions, re-prefill) and its checks."""
    import torch

    df, versions, mask = res.df, res.versions, res.response_mask
    problems: list[str] = []
    out: dict[str, Any] = {}
    tokens = int(df.completion_tokens.sum())
    if tokens != expected:
        problems.append(f"{tokens} tokens sampled, not N x max_new_tokens = {expected}")
    if versions is None:
        problems.append("no versions")
    else:
        real = versions[mask]
        if bool((real < 0).any()):
            problems.append(f"{int((real < 0).sum())} tokens without a version")
        counts = torch.bincount(real.clamp(min=0)) if real.numel() else torch.zeros(0, dtype=torch.long)
        by_version = {str(v): int(c) for v, c in enumerate(counts.tolist()) if c}
        out["tokens_by_version"] = by_version
        if sum(by_version.values()) != tokens:
            problems.append(f"tokens by version add up to {sum(by_version.values())}, not {tokens}")
        steps = versions[:, 1:] - versions[:, :-1]
        if bool((steps[mask[:, 1:]] < 0).any()):
            problems.append("a row's versions go back")
        allowed = {before} if mode is None else {before, before + 1}
        if {int(v) for v in by_version} - allowed:
            problems.append(f"versions {sorted(by_version)} outside {sorted(allowed)}")
        if mode is not None:
            if after != before + 1:
                problems.append(f"the push made {after - before} versions, not 1")
            lengths = mask.sum(-1)
            last = versions[torch.arange(len(lengths)), (lengths - 1).clamp(min=0)]
            ended_new = int((last == before + 1).sum())
            undone = len(lengths) - int((trigger or {}).get("done") or 0)
            out["rows_ending_new"] = ended_new
            if ended_new < undone:
                problems.append(f"{undone} rows were not done at the push but {ended_new} end on the new version")
            if (trigger or {}).get("late"):
                problems.append("the job ended before the push: it did not span it")
        out["old_tokens"] = by_version.get(str(before), 0)
    segments = df.n_segments.astype(int)
    retractions = df.num_retractions.astype(int)
    out.update(n_segments_mean=float(segments.mean()), n_segments_max=int(segments.max()),
               num_retractions_sum=int(retractions.sum()), num_retractions_mean=float(retractions.mean()),
               kv_staleness=dict(Counter(df.kv_staleness.astype(str))),
               finish_reasons=dict(Counter(df.finish_reason.astype(str))))
    # Tokens prefilled again: an abort's continuation requests (exact), a retraction's recompute (lower bound).
    reprefill = 0
    for i, meta in enumerate(res.meta_info):
        prompt = int(df.prompt_tokens.iloc[i])
        for seg in (meta.get("segments") or [])[1:]:
            reprefill += prompt + int(seg.get("start") or 0)
        if int(retractions.iloc[i]) and versions is not None:
            old = int(((versions[i] == before) & mask[i]).sum())
            reprefill += int(retractions.iloc[i]) * (prompt + old)
    out["reprefill_tokens"] = reprefill
    out["checks"] = problems
    out["wrong"] = "; ".join(problems) if problems else None
    return out


def push_run(eng: Any, trainer: Trainer) -> dict[str, Any]:
    before = eng.version_index
    update_s, version = trainer.push(eng, None)
    wrong = None if eng.version_index == before + 1 else f"the push made {eng.version_index - before} versions, not 1"
    return {"seconds": update_s, "tokens": 0, "tok_s": None, "update_s": update_s, "weight_version": version,
            "version_before": before, "version_after": eng.version_index, "checks": [wrong] if wrong else [],
            "wrong": wrong}


def flush(eng: Any, tries: int = 5) -> None:
    """eng.flush_cache() (it also clears the Engine's note of old-weight prefixes); SGLang refuses
    while requests still finish, so a few tries."""
    for attempt in range(tries):
        try:
            eng.flush_cache()
            return
        except Exception:
            if attempt == tries - 1:
                raise
            time.sleep(0.2)


def interleave(names: Sequence[str], run_one: Callable[[str], dict[str, Any]], *, repeats: int, warm: Sequence[str],
               seed: int, results: dict[str, dict[str, Any]], save: Callable[[], None], label: str,
               before_each: Callable[[], None] | None, budget_end: float | None, shown: Callable[[dict[str, Any]], str]
               ) -> dict[str, Any]:
    """One warm-up of each of `warm`, then `repeats` rounds of every method in a shuffled order; each
    run recorded and saved as it ends; a method that raises is recorded and dropped."""
    for name in names:
        results.setdefault(name, {"runs": [], "warmup": None, "error": None})

    def attempt(name: str, what: str) -> dict[str, Any] | None:
        if results[name]["error"] is not None:
            return None
        if before_each is not None:
            try:
                before_each()
            except Exception as err:  # noted, not fatal
                results[name].setdefault("before_each_errors", []).append(f"{type(err).__name__}: {err}")
        gc.collect()
        try:
            run = run_one(name)
        except Exception as err:
            results[name]["error"] = f"{what}: {type(err).__name__}: {err}"
            results[name]["traceback"] = traceback.format_exc(limit=10)
            C.log(f"  {label}{name}: FAILED in {what}: {type(err).__name__}: {str(err)[:300]}")
            save()
            return None
        C.log(f"  {label}{name:18s} {what}: {shown(run)}")
        return run

    for name in warm:
        results[name]["warmup"] = attempt(name, "warm-up")
        save()
    rng = random.Random(seed)
    longest, cut = 0.0, None
    for r in range(repeats):
        if budget_end is not None and time.monotonic() + longest > budget_end:
            cut = f"cut short by --budget-s after {r} of {repeats} rounds (a round took up to {longest:.0f} s)"
            C.log(f"  {label}{cut}")
            break
        t0 = time.monotonic()
        order = list(names)
        rng.shuffle(order)
        for position, name in enumerate(order):
            run = attempt(name, f"repeat {r + 1}/{repeats}")
            if run is not None:
                results[name]["runs"].append({**run, "repeat": r, "after": order[position - 1] if position else None})
                save()
        longest = max(longest, time.monotonic() - t0)
    return {"rounds_planned": repeats, "cut_short": cut}


def show_job(run: dict[str, Any]) -> str:
    text = f"{run['seconds']:7.2f} s {C.fmt(run.get('tok_s')):>10s} tok/s"
    if run.get("update_s") is not None:
        text += f", update {run['update_s']:.3f} s"
    if "tokens_by_version" in run:
        text += f", tokens by version {run['tokens_by_version']}, segments {run['n_segments_mean']:.2f}, " \
                f"retractions {run['num_retractions_sum']}"
    return text + (f"  WRONG: {run['wrong']}" if run.get("wrong") else "")


def span_phase(eng: Any, trainer: Trainer, prompts: list[list[int]], size: dict[str, Any], args: Any,
               record: C.Record, budget_end: float | None) -> None:
    phase = record["span"] = {"methods": {}}

    def run_one(name: str) -> dict[str, Any]:
        if name == "push":
            return push_run(eng, trainer)
        return job_run(eng, trainer, prompts, size, None if name == "none" else name)

    warm = ("none", "push") if args.quick else SPAN_METHODS
    phase.update(interleave(SPAN_METHODS, run_one, repeats=C.repeats_of(args), warm=warm, seed=0,
                            results=phase["methods"], save=record.save, label="span: ",
                            before_each=lambda: flush(eng), budget_end=budget_end, shown=show_job))
    record.save()


# ---------------------------------------------------------------------------------------------
# Trainer: sampler_vs_trainer against one forward pass


def trainer_phase(eng: Any, trainer: Trainer, prompts: list[list[int]], size: dict[str, Any], args: Any,
                  record: C.Record, budget_end: float | None) -> None:
    import torch

    import rlgen

    phase = record["trainer"] = {"methods": {}, "batch_size": size["batch_size"]}
    if not trainer.in_sync:  # a push failed: serve the trainer's weights again, so both sides hold the same
        C.log("trainer: the last push failed; pushing the trainer's weights again")
        trainer.push(eng, None)
    flush(eng)
    t0 = time.perf_counter()
    res = submit(eng, prompts, size).result()
    rollout_s = time.perf_counter() - t0
    before = eng.version_index
    checked = job_details(res, before, before, None, None, expected=len(prompts) * size["max_new_tokens"])
    t = res.tensors()
    scored = int(t["response_mask"].sum())
    phase["rollouts"] = {"seconds": rollout_s, "rows": len(res), "tokens": int(res.n_tokens), "scored_tokens": scored,
                         "input_shape": list(t["input_ids"].shape), "checks": checked["checks"],
                         "wrong": checked["wrong"], "tokens_by_version": checked.get("tokens_by_version")}
    record.save()
    C.log(f"trainer: rollouts {list(t['input_ids'].shape)} in {rollout_s:.1f} s"
          + (f"  WRONG: {checked['wrong']}" if checked["wrong"] else ""))
    cuda = trainer.device == "cuda"
    ids, mask = t["input_ids"], t["attention_mask"].long()
    forward: dict[str, Any] = phase.setdefault("forward", {"chunk": None, "why": None})

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def forward_pass() -> None:
        chunk = forward["chunk"] or len(ids)
        with torch.no_grad():
            for a in range(0, len(ids), chunk):
                out = trainer.model(input_ids=ids[a:a + chunk].to(trainer.device),
                                    attention_mask=mask[a:a + chunk].to(trainer.device), use_cache=False)
                del out

    def run_one(name: str) -> dict[str, Any]:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        if name == "forward":
            try:
                forward_pass()
            except torch.cuda.OutOfMemoryError as err:  # the whole batch at once does not fit: chunks, said so
                if forward["chunk"] is not None:
                    raise
                forward.update(chunk=size["batch_size"], why=f"all {len(ids)} rows at once: {str(err)[:200]}")
                C.log(f"trainer: one forward pass of all {len(ids)} rows is out of memory; in chunks of "
                      f"{size['batch_size']} rows from now on")
                del err
                gc.collect()
                torch.cuda.empty_cache()
                sync()
                t0 = time.perf_counter()
                forward_pass()
            mm = None
        else:
            mm = rlgen.sampler_vs_trainer(res, trainer.model, batch_size=size["batch_size"], progress=False)
        sync()
        seconds = time.perf_counter() - t0
        run: dict[str, Any] = {"seconds": seconds, "tokens": scored, "tok_s": scored / seconds,
                               "chunk": forward["chunk"] if name == "forward" else size["batch_size"]}
        if cuda:
            run["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        if mm is not None:
            phase["mismatch"] = plain(mm.summary)
            phase["mismatch_notes"] = list(mm.notes)
        return run

    def shown(run: dict[str, Any]) -> str:
        text = f"{run['seconds']:7.3f} s {run['tok_s']:12,.0f} tok/s"
        return text + (f", peak {run['peak_mib']:,.0f} MiB" if "peak_mib" in run else "")

    phase.update(interleave(TRAINER_METHODS, run_one, repeats=C.repeats_of(args), warm=TRAINER_METHODS, seed=1,
                            results=phase["methods"], save=record.save, label="trainer: ", before_each=None,
                            budget_end=budget_end, shown=shown))
    record.save()


def plain(value: Any) -> Any:
    """JSON-ready: numpy and torch scalars as Python numbers, NaN as None."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


# ---------------------------------------------------------------------------------------------
# Deterministic: the mismatch and run-to-run reproducibility, SGLang's deterministic mode off and on


def deterministic_phase(setup: Setup, record: C.Record, budget_end: float | None) -> None:
    """Each arm (off, then on) on a server of its own, recorded and saved as it ends; an arm that
    fails is recorded and the next one goes on."""
    phase = record["deterministic"] = {"seed": DETERMINISTIC_SEED, "flag": DETERMINISTIC_FLAG, "arms": {},
                                       "cut_short": None}
    setup.close()  # each arm's server takes the shared server's share of the GPU
    longest = 0.0
    for arm in DETERMINISTIC_ARMS:
        if arm == "on" and setup.args.backend == "cpu":
            phase["arms"][arm] = {"status": "skipped", "reason": CPU_SKIP}
            C.log(f"deterministic: {arm}: skipped: {CPU_SKIP}")
            continue
        if budget_end is not None and time.monotonic() + longest > budget_end:
            phase["cut_short"] = f"cut short by --budget-s before the {arm} arm (an arm took up to {longest:.0f} s)"
            phase["arms"][arm] = {"status": "skipped", "reason": phase["cut_short"]}
            C.log(f"deterministic: {phase['cut_short']}")
            continue
        t0 = time.monotonic()
        try:
            phase["arms"][arm] = deterministic_arm(setup, arm, record["sizes"])
        except Exception as err:  # recorded; the next arm goes on
            phase["arms"][arm] = {"status": "failed", "error": f"{type(err).__name__}: {err}",
                                  "traceback": traceback.format_exc(limit=10)}
            C.log(f"deterministic: {arm}: FAILED: {type(err).__name__}: {str(err)[:300]}")
        longest = max(longest, time.monotonic() - t0)
        phase["arms"][arm]["wall_s"] = time.monotonic() - t0
        record.save()
    phase["removed"] = removed_share(phase["arms"])
    record.save()


def deterministic_arm(setup: Setup, arm: str, size: dict[str, Any]) -> dict[str, Any]:
    """A fresh server (on: with the flag), the seeded batch twice, then the first scored by the trainer."""
    import rlgen

    flags = [DETERMINISTIC_FLAG] if arm == "on" else []
    eng, server = setup.start_engine(f"server-deterministic-{arm}", flags)
    try:
        trainer, prompts = setup.trainer_and_prompts(eng)
        first, batch = seeded_batch(eng, prompts, size)
        second, again = seeded_batch(eng, prompts, size)
    finally:
        eng.close()
    trainer.restore()  # the checkpoint's weights: what this arm's fresh server served
    t0 = time.perf_counter()
    mm = rlgen.sampler_vs_trainer(first, trainer.model, batch_size=size["batch_size"], progress=False)
    score_s = time.perf_counter() - t0
    out = {"status": "ran", "server_args": flags, "server": server, "start_s": server["start_s"],
           "batch": batch, "mismatch": {**mismatch_numbers(mm), "score_s": score_s},
           "rerun": {**again, **run_to_run(first, second)}}
    m, r = out["mismatch"], out["rerun"]
    C.log(f"deterministic: {arm}: start {server['start_s']:.1f} s, {batch['tokens']} tokens at "
          f"{batch['tok_s']:,.0f} tok/s; mean |log r| {C.fmt(m['abs_log_ratio_mean'], '.4g')}, max "
          f"{C.fmt(m['abs_log_ratio_max'], '.4g')}, k3 {C.fmt(m['k3_kl'], '.3g')}; again: identical ids "
          f"{r['identical_ids']}, max |logprob diff| {C.fmt(r['max_abs_logprob_diff'], '.3g')}")
    return out


def seeded_batch(eng: Any, prompts: list[list[int]], size: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The prompts sampled once with the fixed seed, after a cache flush; the result and its timing."""
    import warnings

    flush(eng)
    gc.collect()
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the off arm's server ignores the seed: recorded as honours_seed
        warnings.filterwarnings("ignore", message="seed= will not make sampling reproducible")
        res = eng.submit(prompts, max_new_tokens=size["max_new_tokens"], temperature=1.0, ignore_eos=True,
                         logprobs=True, seed=DETERMINISTIC_SEED, progress=False).result()
    seconds = time.perf_counter() - t0
    return res, {"seconds": seconds, "tokens": int(res.n_tokens), "tok_s": res.n_tokens / seconds}


def mismatch_numbers(mm: Any) -> dict[str, Any]:
    """What the phase reports of a `SamplerMismatch`: |log r| over the compared tokens, and the summary's."""
    s = mm.summary
    abs_lr = mm.log_ratio[mm.mask].abs()
    return {"tokens": int(s["tokens"]),
            "abs_log_ratio_mean": float(abs_lr.mean()) if abs_lr.numel() else None,
            "abs_log_ratio_max": float(abs_lr.max()) if abs_lr.numel() else None,
            "k3_kl": plain(s["k3_kl"]), "tis_token_clip_fraction": plain(s["tis_token_clip_fraction"]),
            "mis_token_mask_fraction": plain(s["mis_token_mask_fraction"]), "tis_cap": s["tis_cap"],
            "mis_bounds": [s["mis_lower"], s["mis_upper"]], "summary": plain(s), "notes": list(mm.notes)}


def run_to_run(a: Any, b: Any) -> dict[str, Any]:
    """The same seeded batch twice: whether every sampled token id is the same, and the largest
    |logprob difference| over each row's positions up to its first differing token (same prefix,
    same token: the same computation, had it been deterministic)."""
    import torch

    ta, tb = a.tensors(), b.tensors()
    width = min(ta["response_ids"].shape[-1], tb["response_ids"].shape[-1])
    ids_a, ids_b = ta["response_ids"][:, :width], tb["response_ids"][:, :width]
    ma, mb = ta["response_mask"][:, :width].bool(), tb["response_mask"][:, :width].bool()
    lp_a, lp_b = ta["logprobs"][:, :width].double(), tb["logprobs"][:, :width].double()
    same_shape = ta["response_mask"].shape == tb["response_mask"].shape
    same = ((ids_a == ids_b) | ~(ma | mb)) & (ma == mb)
    rows_identical = same.all(-1)
    prefix = ((ids_a == ids_b) & ma & mb).long().cumprod(-1).bool() & lp_a.isfinite() & lp_b.isfinite()
    diff = (lp_a - lp_b).abs()[prefix]
    return {"identical_ids": bool(same_shape and rows_identical.all()), "rows": len(rows_identical),
            "rows_identical": int(rows_identical.sum()), "tokens_differing": int(((ids_a != ids_b) & ma & mb).sum()),
            "logprob_positions_compared": int(prefix.sum()),
            "max_abs_logprob_diff": float(diff.max()) if diff.numel() else None,
            "mean_abs_logprob_diff": float(diff.mean()) if diff.numel() else None,
            "logprobs_identical": bool(diff.numel() and torch.equal(lp_a[prefix], lp_b[prefix]))}


def removed_share(arms: dict[str, Any]) -> dict[str, Any]:
    """1 - on / off of the mean |log r|: the share of the mismatch deterministic mode removes."""
    off, on = ((arms.get(arm) or {}).get("mismatch", {}).get("abs_log_ratio_mean") for arm in DETERMINISTIC_ARMS)
    if off is None or on is None:
        missing = [arm for arm, v in zip(DETERMINISTIC_ARMS, (off, on)) if v is None]
        why = "; ".join(f"the {arm} arm {(arms.get(arm) or {}).get('status') or 'not run'}" for arm in missing)
        return {"off": off, "on": on, "share": None, "why": why}
    return {"off": off, "on": on, "share": 1 - on / off if off > 0 else None,
            "why": None if off > 0 else "the off arm has no mismatch to remove"}


# ---------------------------------------------------------------------------------------------
# Report


def bootstrap_excess(mode: Sequence[float], none: Sequence[float], push: Sequence[float], *, level: float = 0.9,
                     draws: int = 4000, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of med(mode) - med(none) - (med(push) + 0.1 x med(none)), each
    of the three run sets resampled on its own; None below 3 runs a side."""
    if min(len(mode), len(none), len(push)) < 3:
        return None
    rng = random.Random(seed)
    med = statistics.median
    values = sorted(
        med(rng.choices(mode, k=len(mode))) - (1 + PUSH_SHARE_BOUND) * med(rng.choices(none, k=len(none)))
        - med(rng.choices(push, k=len(push)))
        for _ in range(draws))
    tail = (1 - level) / 2
    return values[int(tail * draws)], values[min(draws - 1, int((1 - tail) * draws))]


def wrong_runs(per: dict[str, Any], names: Sequence[str]) -> str | None:
    bad = [f"{name} repeat {r['repeat'] + 1}: {r['wrong']}" for name in names
           for r in (per.get(name) or {}).get("runs", []) if r.get("wrong")]
    failed = [f"{name}: {per[name]['error']}" for name in names if (per.get(name) or {}).get("error")]
    return "; ".join(failed + bad)[:500] or None


def median_of(per: dict[str, Any], name: str, key: str) -> float | None:
    return C.median_or_none(C.runs_of(per, [name], key))


def interval_text(interval: Sequence[float] | None, spec: str = ".3f") -> str:
    return f"[{interval[0]:{spec}}, {interval[1]:{spec}}]" if interval else "[-]"


def report_span(phase: dict[str, Any], targets: C.Targets, record: C.Record) -> None:
    per = phase["methods"]
    sizes = record["sizes"]
    rows = []
    push_s = median_of(per, "push", "seconds")
    none_s = median_of(per, "none", "seconds")
    for name in SPAN_METHODS:
        runs = (per.get(name) or {}).get("runs", [])
        secs = C.runs_of(per, [name], "seconds")
        extra = C.compare_difference(per, name, ["none"]) if name in MODES else None
        rows.append([name, str(len(runs)), C.fmt(median_of(per, name, "seconds"), ".3f"),
                     interval_text(C.bootstrap_median(secs)), C.fmt(median_of(per, name, "tok_s")),
                     C.fmt(median_of(per, name, "update_s"), ".3f"),
                     C.fmt(extra and extra["difference"], "+.3f"), interval_text(extra and extra["interval"]),
                     C.fmt(median_of(per, name, "n_segments_mean"), ".2f"),
                     C.fmt(median_of(per, name, "num_retractions_sum"), ".0f"),
                     C.fmt(median_of(per, name, "reprefill_tokens"), ",.0f"),
                     C.fmt(median_of(per, name, "old_tokens"), ",.0f"),
                     "ok" if runs and not any(r.get("wrong") for r in runs) else ("-" if not runs else "WRONG")])
    C.print_table(
        f"span: one job of {sizes['prompts']} prompts x {sizes['max_new_tokens']} tokens, push at "
        f"{sizes['push_at']:g} of its tokens (medians; [90% interval]; extra: minus none's median, compare_difference)",
        ["method", "runs", "wall s", "interval", "tok/s", "update s", "extra s", "interval", "segments",
         "retractions", "re-prefilled", "old tokens", "checks"], rows)
    every = [[name, str(r["repeat"] + 1), f"{r['seconds']:.3f}", C.fmt(r.get("tok_s")), C.fmt(r.get("update_s"), ".3f"),
              " ".join(f"v{k}:{v}" for k, v in (r.get("tokens_by_version") or {}).items()) or "-",
              C.fmt(r.get("n_segments_mean"), ".2f"), C.fmt(r.get("num_retractions_sum")),
              r.get("wrong") or "ok"]
             for name in SPAN_METHODS for r in (per.get(name) or {}).get("runs", [])]
    C.print_table("span: every run", ["method", "repeat", "wall s", "tok/s", "update s", "tokens by version",
                                      "segments", "retractions", "checks"], every)
    if phase.get("cut_short"):
        print(f"  note: {phase['cut_short']}", flush=True)
    print("\nTargets, span", flush=True)
    for mode in MODES:
        wrong = wrong_runs(per, [mode, "none", "push"])
        excess = None
        if none_s is not None and push_s is not None and median_of(per, mode, "seconds") is not None:
            excess = median_of(per, mode, "seconds") - none_s - (push_s + PUSH_SHARE_BOUND * none_s)
        interval = bootstrap_excess(C.runs_of(per, [mode], "seconds"), C.runs_of(per, ["none"], "seconds"),
                                    C.runs_of(per, ["push"], "seconds"))
        targets.check_interval(f"{mode}: job's extra s over none - (push s + 10% of none's s)", excess, interval,
                               0.0, op="<", unit="s", wrong=wrong)
    for mode in MODES:
        d = C.compare_difference(per, mode, ["push"], key="update_s")
        targets.check_interval(f"{mode}: pause-to-continue (update call under the job) - push alone", d["difference"],
                               d["interval"], PAUSE_BOUND_S, op="<", unit="s", wrong=wrong_runs(per, [mode, "push"]))
    phase["judged"] = {mode: {"extra": C.compare_difference(per, mode, ["none"]),
                              "tok_s": C.compare(per, mode, ["none"]),
                              "pause_to_continue": C.compare_difference(per, mode, ["push"], key="update_s")}
                       for mode in MODES}
    fastest(per, phase, push_s)


def fastest(per: dict[str, Any], phase: dict[str, Any], push_s: float | None) -> None:
    """Which mode's job is fastest (lowest median wall) and why, from the numbers."""
    ranked = sorted((m for m in MODES if median_of(per, m, "seconds") is not None),
                    key=lambda m: median_of(per, m, "seconds"))  # type: ignore[arg-type, return-value]
    if not ranked:
        return
    print("\nFastest mode (lowest median wall of the job; not judged)", flush=True)
    for m in ranked:
        secs = C.runs_of(per, [m], "seconds")
        print(f"  {m:9s} {median_of(per, m, 'seconds'):.3f} s {interval_text(C.bootstrap_median(secs))}, "
              f"{C.fmt(median_of(per, m, 'tok_s'))} tok/s", flush=True)
    best = ranked[0]
    verdict: dict[str, Any] = {"fastest": best, "order": ranked}
    if len(ranked) > 1:
        d = C.compare_difference(per, ranked[1], [best])
        clear = d["interval"] is not None and d["interval"][0] > 0
        verdict["next"] = {"mode": ranked[1], **d, "separated": clear}
        print(f"  fastest: {best}; {ranked[1]} is {d['difference']:+.3f} s {interval_text(d['interval'])} slower: "
              f"{'separated by these runs' if clear else 'NOT separated by these runs (the interval holds 0)'}",
              flush=True)
    none_s = median_of(per, "none", "seconds")
    why = {}
    for m in ranked:
        extra = (median_of(per, m, "seconds") or 0.0) - (none_s or 0.0) if none_s is not None else None
        update = median_of(per, m, "update_s")
        rest = extra - update if extra is not None and update is not None else None
        segments, retr = median_of(per, m, "n_segments_mean"), median_of(per, m, "num_retractions_sum")
        refill = median_of(per, m, "reprefill_tokens")
        what = {"abort": f"each running request ended and was sent again as prompt + tokens so far: {C.fmt(refill)} "
                         f"tokens prefilled again under the new weights (segments per sample {C.fmt(segments, '.2f')})",
                "retract": f"the running requests were retracted ({C.fmt(retr)} retractions) and their KV recomputed "
                           f"on continue: at least {C.fmt(refill)} tokens prefilled again, in one request each",
                "in_place": f"the KV is kept: nothing prefilled again ({C.fmt(refill)} tokens, {C.fmt(retr)} "
                            f"retractions); tokens after the push attend to old-weight KV"}[m]
        line = (f"{m}: +{C.fmt(extra, '.3f')} s over none = the update call {C.fmt(update, '.3f')} s (pause, push "
                f"{C.fmt(push_s, '.3f')} s alone, continue) + {C.fmt(rest, '.3f')} s after it; {what}")
        why[m] = {"extra_s": extra, "update_s": update, "after_update_s": rest, "reprefill_tokens": refill,
                  "n_segments": segments, "num_retractions": retr, "text": line}
        print(f"  {line}", flush=True)
    verdict["why"] = why
    phase["fastest"] = verdict


def report_trainer(phase: dict[str, Any], targets: C.Targets) -> None:
    per = phase["methods"]
    rows = []
    for name in TRAINER_METHODS:
        runs = (per.get(name) or {}).get("runs", [])
        secs = C.runs_of(per, [name], "seconds")
        rows.append([name, str(len(runs)), C.fmt(median_of(per, name, "seconds"), ".3f"),
                     interval_text(C.bootstrap_median(secs)), C.fmt(median_of(per, name, "tok_s")),
                     C.fmt(median_of(per, name, "peak_mib")), C.fmt(runs[-1].get("chunk") if runs else None),
                     (per.get(name) or {}).get("error") or "ok"])
    ro = phase.get("rollouts") or {}
    C.print_table(f"trainer: {ro.get('rows')} rows, input {ro.get('input_shape')}, {C.fmt(ro.get('scored_tokens'))} "
                  f"sampled tokens scored (medians; [90% interval])",
                  ["method", "runs", "s", "interval", "tokens/s", "peak MiB", "rows/pass", "error"], rows)
    forward = phase.get("forward") or {}
    if forward.get("chunk"):
        print(f"  note: the forward pass ran in chunks of {forward['chunk']} rows: {forward.get('why')}", flush=True)
    if phase.get("cut_short"):
        print(f"  note: {phase['cut_short']}", flush=True)
    mm = phase.get("mismatch") or {}
    keys = ("tokens", "k3_kl", "kl", "log_ppl_diff", "ppl_ratio", "sampling_logp_difference/mean",
            "sampling_logp_difference/max", "tis_token_clip_fraction", "mis_token_mask_fraction")
    shown = [f"{k} {mm[k]:.4g}" if isinstance(mm.get(k), float) else f"{k} {mm.get(k)}" for k in keys if k in mm]
    if shown:
        print(f"  mismatch (sampler vs trainer, last run): {', '.join(shown)}", flush=True)
    print("\nTargets, trainer", flush=True)
    c = C.compare(per, "sampler_vs_trainer", ["forward"], key="seconds")
    phase["judged"] = c
    wrong = "; ".join(filter(None, [wrong_runs(per, TRAINER_METHODS), ro.get("wrong")])) or None
    targets.check_interval("sampler_vs_trainer s / one forward pass s", c["ratio"], c["interval"], TRAINER_BOUND,
                           op="<", unit="x", wrong=wrong)


def report_deterministic(phase: dict[str, Any]) -> None:
    """Each arm's numbers, the share of the mismatch deterministic mode removes, the run-to-run figures.
    A measurement: nothing is judged."""
    rows = []
    for arm in DETERMINISTIC_ARMS:
        a = (phase.get("arms") or {}).get(arm) or {}
        m, r, b = a.get("mismatch") or {}, a.get("rerun") or {}, a.get("batch") or {}
        rows.append([arm, a.get("status") or "not run", C.fmt(a.get("start_s"), ".1f"), C.fmt(m.get("tokens")),
                     C.fmt(b.get("tok_s")), C.fmt(m.get("abs_log_ratio_mean"), ".4g"),
                     C.fmt(m.get("abs_log_ratio_max"), ".4g"), C.fmt(m.get("k3_kl"), ".3g"),
                     C.fmt(m.get("tis_token_clip_fraction"), ".3g"), C.fmt(m.get("mis_token_mask_fraction"), ".3g"),
                     "-" if r.get("identical_ids") is None else ("yes" if r["identical_ids"] else "NO"),
                     C.fmt(r.get("max_abs_logprob_diff"), ".3g")])
    C.print_table(f"deterministic: sampler vs trainer, server's {phase.get('flag')} off and on (one batch, seed "
                  f"{phase.get('seed')}, T=1; TIS cap 2, MIS [0.5, 2]; again: the same batch sampled a second time)",
                  ["arm", "status", "start s", "tokens", "tok/s", "mean |log r|", "max |log r|", "k3 KL", "TIS clip",
                   "MIS mask", "again identical", "again max |dlp|"], rows)
    for arm in DETERMINISTIC_ARMS:
        a = (phase.get("arms") or {}).get(arm) or {}
        if a.get("status") in ("skipped", "failed"):
            print(f"  {arm}: {a['status']}: {a.get('reason') or a.get('error')}", flush=True)
    removed = phase.get("removed") or {}
    share = removed.get("share")
    shown = f"{100 * share:.1f}%" if share is not None else f"n/a ({removed.get('why')})"
    print(f"  mismatch removed by deterministic mode: {shown} of mean |log r| (1 - on/off: "
          f"{C.fmt(removed.get('on'), '.4g')} / {C.fmt(removed.get('off'), '.4g')})", flush=True)
    for arm in DETERMINISTIC_ARMS:
        r = ((phase.get("arms") or {}).get(arm) or {}).get("rerun")
        if r:
            print(f"  run to run, {arm}: sampled ids {'identical' if r['identical_ids'] else 'DIFFER'} "
                  f"({r['rows_identical']}/{r['rows']} rows, {r['tokens_differing']} tokens differ); max |logprob "
                  f"difference| {C.fmt(r['max_abs_logprob_diff'], '.3g')} over {r['logprob_positions_compared']} "
                  f"positions of equal prefixes", flush=True)
    print("  (a measurement: no target, nothing judged)", flush=True)


def report(record: C.Record) -> None:
    data = record.data
    env = data.get("environment") or {}
    print(f"\nbench/offpolicy.py: {data.get('model')} on {(data.get('server') or {}).get('backend')}, "
          f"GPU {env.get('gpu')}, rlgen {(env.get('rlgen_commit') or {}).get('commit')}"
          f"{' (dirty)' if (env.get('rlgen_commit') or {}).get('dirty') else ''}\n  command: {env.get('command')}",
          flush=True)
    targets = C.Targets()
    if "span" in data:
        report_span(data["span"], targets, record)
    if "trainer" in data:
        report_trainer(data["trainer"], targets)
    if "deterministic" in data:
        report_deterministic(data["deterministic"])
    for name in PHASES:
        if (data.get(name) or {}).get("error"):
            print(f"\nphase {name} FAILED: {data[name]['error']}", flush=True)
    if data.get("error"):
        print(f"\nERROR: {data['error']}", flush=True)
    record["targets"] = targets.rows


# ---------------------------------------------------------------------------------------------
# Main


class Setup:
    """What the phases share, made when a phase first needs it: the server of span and trainer
    (started again if a deterministic phase closed it), the trainer (loaded once, after a server is
    up), and the prompts (rendered once)."""

    def __init__(self, args: Any, model: str, record: C.Record) -> None:
        self.args, self.model, self.record = args, model, record
        self.on_gpu = args.backend == "sglang"
        self.eng: Any = None
        self.trainer: Trainer | None = None
        self.prompts: list[list[int]] | None = None

    def start_engine(self, name: str, flags: list[str]) -> tuple[Any, dict[str, Any]]:
        """A server, as every phase starts one, with `flags` after the bench's own; it and what it says."""
        import rlgen

        C.log(f"starting rlgen.Engine({self.model!r}, backend={self.args.backend!r}"
              f"{f', server_args={flags}' if flags else ''}) ...")
        t0 = time.monotonic()
        fraction = self.args.gpu_memory_fraction if self.on_gpu else None
        eng = rlgen.Engine(self.model, backend=self.args.backend, progress=False, server_args=flags or None,
                           log_dir=C.logs_dir(self.args.out, name), gpu_memory_fraction=fraction)
        info = eng.server_info or {}
        server = {"backend": eng.backend, "start_s": time.monotonic() - t0, "url": eng.url,
                  "argv": (eng.info or {}).get("command"), "max_total_num_tokens": info.get("max_total_num_tokens"),
                  "gpu_memory_fraction": fraction,
                  "enable_deterministic_inference": info.get("enable_deterministic_inference")}
        C.log(f"server ready in {server['start_s']:.1f} s; KV tokens {info.get('max_total_num_tokens')}")
        self.record.data.setdefault("server", server)
        return eng, server

    def trainer_and_prompts(self, eng: Any) -> tuple[Trainer, list[list[int]]]:
        size, record = self.record["sizes"], self.record
        if self.trainer is None:
            self.trainer = Trainer(self.model, self.args.push or ("model" if self.on_gpu else "tensor"))
            record["trainer_model"] = self.trainer.summary()
            C.log(f"trainer on {self.trainer.device} ({self.trainer.load_s:.1f} s), pushing {self.trainer.push_what}")
        if self.prompts is None:
            self.prompts = C.chat_prompts(size["prompts"], eng.tokenizer, seed=0)
            record["workload"] = {"prompts": len(self.prompts), "prompt_tokens_min": min(map(len, self.prompts)),
                                  "prompt_tokens_max": max(map(len, self.prompts)),
                                  "options": {"max_new_tokens": size["max_new_tokens"], "temperature": 1.0,
                                              "ignore_eos": True, "logprobs": True,
                                              "sampling_params": {"stream_interval": size["stream_interval"]}}}
            C.log(f"{len(self.prompts)} prompts x {size['max_new_tokens']} tokens, push at {size['push_at']:g} "
                  f"(chunks every {size['stream_interval']} tokens)")
        record.save()
        return self.trainer, self.prompts

    def server(self) -> tuple[Any, Trainer, list[list[int]]]:
        """The server span and trainer share (the trainer holding the weights it serves)."""
        if self.eng is None:
            self.eng, self.record["server"] = self.start_engine("server", [])
            if self.trainer is not None:
                self.trainer.restore()  # a fresh server serves the checkpoint's weights
        return (self.eng, *self.trainer_and_prompts(self.eng))

    def close(self) -> None:
        if self.eng is not None:
            C.log("closing the server")
            eng, self.eng = self.eng, None
            eng.close()


def measure(args: Any, model: str, record: C.Record, budget_end: float | None) -> None:
    setup = Setup(args, model, record)
    try:
        for name in args.phases:
            try:
                if name == "deterministic":
                    deterministic_phase(setup, record, budget_end)
                else:
                    eng, trainer, prompts = setup.server()
                    (span_phase if name == "span" else trainer_phase)(eng, trainer, prompts, record["sizes"], args,
                                                                      record, budget_end)
            except Exception as err:  # report what there is, go on with the next phase
                record.data.setdefault(name, {})["error"] = f"{type(err).__name__}: {err}"
                record.data[name]["traceback"] = traceback.format_exc(limit=10)
                C.log(f"phase {name} FAILED: {type(err).__name__}: {err}")
            record.save()
    finally:
        setup.close()


def main() -> None:
    started = time.monotonic()
    ap = C.base_parser(__doc__, repeats=REPEATS)
    ap.add_argument("--phases", default=",".join(DEFAULT_PHASES),
                    help=f"comma-separated, run in this order, of {','.join(PHASES)} (default "
                         f"{','.join(DEFAULT_PHASES)})")
    ap.add_argument("--prompts", type=int, default=None, help="chat prompts per job (default 256; 4 with --quick)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="tokens per sample, exactly (ignore_eos) (default 512; 16 with --quick)")
    ap.add_argument("--push-at", type=float, default=0.3,
                    help="push once the job has sampled this share of its tokens (default 0.3)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="sampler_vs_trainer's rows per forward pass, and the forward pass's chunk if the whole "
                         "batch is out of memory (default 32; 4 with --quick)")
    ap.add_argument("--push", choices=("model", "tensor"), default=None,
                    help="what a push sends: the whole state dict (default on sglang) or the one perturbed tensor "
                         "(default on cpu: the CPU backend gets tensors by value)")
    ap.add_argument("--gpu-memory-fraction", type=float, default=0.5,
                    help="sglang: the server's share of the GPU (the trainer shares it; default 0.5)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting rounds once the longest so far would end past this many seconds since the "
                         "script started (default: no limit)")
    C.add_report_only(ap)
    args = ap.parse_args()
    args.phases = C.subset(ap, "--phases", args.phases, PHASES)
    if not 0 < args.push_at < 1:
        ap.error("--push-at must be in (0, 1)")
    if C.reported_again(args, report):
        return
    if args.backend == "sglang":
        C.site_flags()  # before the launch: rlgen's Engine reads $RLGEN_SGLANG_ARGS itself
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/offpolicy.py")
    size: dict[str, Any] = dict(SIZES["quick" if args.quick else "full"])
    for key in ("prompts", "max_new_tokens", "batch_size"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    size.update(push_at=args.push_at, repeats=C.repeats_of(args),
                stream_interval=max(1, math.ceil(args.push_at * size["max_new_tokens"])))
    record.data.update(model=model, sizes=size, phases=args.phases)
    record.save()
    budget_end = started + args.budget_s if args.budget_s else None
    C.measure_and_report(record, lambda: measure(args, model, record, budget_end), report)


if __name__ == "__main__":
    main()
