"""Weights from the notebook, no disk, on real SGLang: `Engine.update_weights` through CUDA IPC.

Owns the GPU proof of `update_weights` (issue "The RL loop at real model sizes", §1). The notebook
side holds the model with transformers on the GPU (bf16, as the checkpoint); rlgen's Engine owns an
SGLang server (memory saver on) on the same GPU. Phases, each saved to --out as it ends:

    noise       the same fixed texts scored 5 times (prefix cache flushed between some): SGLang's own
                run-to-run noise, which every "equal" below is judged against; and the server's
                weights checksum (SGLang's /weights_checker {"action": "checksum"}) of the checkpoint
    identical   the unchanged model pushed (bf16, then as fp32 copies): logprobs and checksum as before
    perturbed   noise on every matrix (in place, as a training step), pushed: logprobs move, checksum
                changes, rows carry the version; the same weights saved to disk and loaded with
                update_weights_from_disk on the same server: logprobs and checksum equal the push's
    restore     copies of the original tensors pushed back and zeroed the moment the call returns (the
                server must hold its own copy by then): logprobs and checksum of the checkpoint again
    buckets     bucket_mb 16 (several requests) with and without flatten, 512 with flatten: the same
                result as one request (requests counted)
    timing      repeats in a shuffled order: update_weights (512 MiB buckets; flatten; 32 MiB buckets),
                update_weights_from_disk of the saved copy, and save_pretrained + update_weights_from_disk
                (the disk path as a whole); medians with 90% bootstrap intervals; the notebook's peak
                extra GPU memory per variant
    paused      a push inside `with eng.paused():` (nothing reloaded from disk), a partial push inside
                (lands on the reloaded old weights), a push after the block, and a pause without a push
                after one (the checkpoint comes back under its own version)
    refusals    what update_weights refuses on SGLang before sending (CPU tensors, an unknown name), and
                SGLang's own answer to an unknown name sent anyway (success, a log line)
    fresh       the Engine closed; a fresh server started on the saved perturbed weights: its logprobs
                and checksum against the push's; then (last, it may kill that server) a raw push of a
                tensor of the wrong shape, to see what SGLang does with it

    python scripts/gpu/weights_check.py --out $OUT/weights_check.json                # GPU machine
    python scripts/gpu/weights_check.py --backend cpu --quick --out /tmp/w.json      # dry run anywhere
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
import _common as C  # noqa: E402

TEXTS = ["The capital of France is", "def add(a, b):", "List three fruits:", "Rain falls on",
         "The derivative of x**2 is", "Once upon a time"]
COMPLETIONS = [" Paris, a city on the Seine.", "\n    return a + b", " apples, pears and plums.", " the quiet town.",
               " 2*x, by the power rule.", " there was a small robot who loved to read."]
REPEATS = 7


def main() -> None:
    begun = C.begin(__doc__, "scripts/gpu/weights_check.py", report, repeats=REPEATS)
    if begun is None:
        return
    args, model, record = begun
    warnings.filterwarnings("ignore", message="these prompts are plain text")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import rlgen
    from rlgen.engine._weights import server_gpus

    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(tempfile.mkdtemp(prefix="rlgen-push-"))
    trainer = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to(device)
    originals = {n: t.detach().clone() for n, t in trainer.state_dict().items()}
    record.data.update(model=model, device=device, phases={})
    phases = record["phases"]

    def phase(name: str, data: dict[str, Any]) -> None:
        phases[name] = data
        record.save()
        C.log(f"{name}: {json.dumps(data, default=str)[:600]}")

    t0 = time.monotonic()
    eng = rlgen.Engine(model, backend=args.backend, progress=False, enable_memory_saver=True, fast_start=True,
                       gpu_memory_fraction=0.3)
    record["engine_start_s"] = time.monotonic() - t0
    record["server_gpus_seen"] = sorted(server_gpus(eng._server) or [])  # nvidia-smi's view of the server's GPUs
    if torch.cuda.is_available():
        from rlgen.client._tensors import device_uuid

        record["trainer_gpu_uuid"] = device_uuid(torch.cuda.current_device())
    spy = RequestSpy(eng)
    try:
        # -- noise -----------------------------------------------------------------------------
        runs = []
        for i in range(5):
            if i % 2:
                eng.flush_cache()
            runs.append(score(eng))
        base = runs[0]
        noise = max(diff(base, r)["max"] for r in runs[1:])
        tol = max(2 * noise, 1e-3)
        c0 = checksum(eng)
        phase("noise", {"max_abs_between_runs": noise, "runs": len(runs), "tolerance": tol, "checksum": c0})

        # -- identical ---------------------------------------------------------------------------
        data: dict[str, Any] = {}
        for label, weights in (("bf16", trainer), ("fp32", {n: t.float() for n, t in originals.items()})):
            t = time.monotonic()
            version = eng.update_weights(weights, weight_version=f"identical-{label}")
            data[label] = {"seconds": time.monotonic() - t, "version": version, **diff(base, score(eng)),
                           "checksum_equal": same(checksum(eng), c0)}
        phase("identical", data)

        # -- perturbed, and the same weights from disk on the same server ----------------------
        perturb(trainer, seed=0)
        eng.update_weights(trainer, weight_version="perturbed")
        res = eng.score(TEXTS, COMPLETIONS)
        pushed, c1 = res.logprobs, checksum(eng)
        saved = work / "perturbed"
        trainer.save_pretrained(saved)
        AutoTokenizer.from_pretrained(model).save_pretrained(saved)
        eng.update_weights_from_disk(saved, weight_version="perturbed-disk")
        from_disk, c_disk = score(eng), checksum(eng)
        phase("perturbed", {"moved_from_base": diff(base, pushed), "rows_version": sorted(set(res.df.weight_version)),
                            "checksum_changed": None if c1 is None else c1 != c0,
                            "push_vs_disk_same_server": diff(pushed, from_disk),
                            "push_equals_disk": diff(pushed, from_disk)["max"] <= tol,
                            "checksum_push_equals_disk": same(c1, c_disk)})

        # -- restore: copies of the originals, zeroed the moment the call returns (as a trainer's
        # next step would write them): the server must have copied them by then -------------
        copies = {n: t.clone() for n, t in originals.items()}
        eng.update_weights(copies, weight_version="restored")
        for t in copies.values():
            t.zero_()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        phase("restore", {**diff(base, score(eng)), "checksum_equal": same(checksum(eng), c0)})

        # -- buckets -----------------------------------------------------------------------------
        data = {}
        for bucket_mb, flatten in ((16, False), (16, True), (512, True)):
            spy.bodies.clear()
            eng.update_weights(trainer, bucket_mb=bucket_mb, flatten=flatten)
            data[f"{bucket_mb}MiB{'-flat' if flatten else ''}"] = {
                "requests": len(spy.bodies), "flush_cache": [b["flush_cache"] for b in spy.bodies][-3:],
                **diff(pushed, score(eng)), "checksum_equal": same(checksum(eng), c1)}
        phase("buckets", data)

        # -- timing ------------------------------------------------------------------------------
        phase("timing", timing(eng, trainer, saved, work, torch, repeats=C.repeats_of(args)))

        # -- paused ------------------------------------------------------------------------------
        phase("paused", paused(eng, trainer, originals, model, base, pushed, tol, c0, c1, torch))

        # -- refusals ----------------------------------------------------------------------------
        phase("refusals", refusals(eng, originals, torch))
    finally:
        eng.close()

    # -- fresh ---------------------------------------------------------------------------------
    t0 = time.monotonic()
    with rlgen.Engine(str(saved), backend=args.backend, progress=False, fast_start=True,
                      gpu_memory_fraction=0.3) as fresh:
        start_s = time.monotonic() - t0
        fresh_lp, c_fresh = score(fresh), checksum(fresh)
        data = {"start_s": start_s, "push_vs_fresh": diff(pushed, fresh_lp),
                "push_equals_fresh": diff(pushed, fresh_lp)["max"] <= tol, "checksum_push_equals_fresh": same(c1, c_fresh)}
        phase("fresh", data)
        phase("shape_mismatch", shape_mismatch(fresh, torch))
    report(record)
    record.save(complete=True)


# ---- measuring ---------------------------------------------------------------------------------------


def score(eng: Any) -> Any:
    return eng.score(TEXTS, COMPLETIONS).logprobs


def diff(a: Any, b: Any) -> dict[str, float]:
    d = (a.float() - b.float()).abs()
    return {"max": float(d.max()), "mean": float(d.mean())}


def same(a: str | None, b: str | None) -> bool | None:
    return None if a is None or b is None else a == b


def checksum(eng: Any) -> str | None:
    """SGLang's weights checksum (/weights_checker, action "checksum"); None where it has none (the CPU backend)."""
    status, raw = C.http_request(eng.url, "/weights_checker", {"action": "checksum"}, timeout=120)
    if status != 200:
        return None
    body = json.loads(raw)
    found = body.get("per_engine_checksum")
    if found is None and body.get("ranks"):
        found = json.dumps([r.get("per_gpu_checksum") for r in body["ranks"]])
    return None if found is None else str(found)


def perturb(model: Any, *, seed: int, scale: float = 0.2) -> None:
    """Noise on every weight matrix, in place (an exaggerated training step)."""
    import torch

    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.add_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32).to(p.dtype)
                       * p.float().std().to(p.dtype) * scale)


class RequestSpy:
    """The /update_weights_from_tensor bodies the Engine sends (their flags, not their payloads)."""

    def __init__(self, eng: Any) -> None:
        self.bodies: list[dict[str, Any]] = []
        post = eng._client.post

        async def spy(path: str, body: Any = None, **kwargs: Any) -> Any:
            if path == "/update_weights_from_tensor":
                self.bodies.append({k: v for k, v in body.items() if k != "serialized_named_tensors"})
            return await post(path, body, **kwargs)

        eng._client.post = spy


def timing(eng: Any, trainer: Any, saved: Path, work: Path, torch: Any, *, repeats: int) -> dict[str, Any]:
    variants = {
        "update_weights": lambda: eng.update_weights(trainer),
        "update_weights flatten": lambda: eng.update_weights(trainer, flatten=True),
        "update_weights 32MiB": lambda: eng.update_weights(trainer, bucket_mb=32),
        "update_weights_from_disk": lambda: eng.update_weights_from_disk(saved),
        "save + update_weights_from_disk": lambda: (trainer.save_pretrained(work / "probe"),
                                                    eng.update_weights_from_disk(work / "probe")),
    }
    runs: dict[str, list[float]] = {name: [] for name in variants}
    peak: dict[str, int] = {}
    rng = random.Random(0)
    for fn in variants.values():  # warm-up, untimed
        fn()
    for _ in range(repeats):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            t = time.monotonic()
            variants[name]()
            runs[name].append(time.monotonic() - t)
            if torch.cuda.is_available():
                peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated() - before)
    out: dict[str, Any] = {}
    for name, values in runs.items():
        interval = C.bootstrap_median(values)
        out[name] = {"median_s": C.median_or_none(values), "interval_s": interval, "runs": values,
                     "notebook_peak_extra_mib": peak.get(name, 0) / (1 << 20) if peak else None}
    return out


def paused(eng: Any, trainer: Any, originals: dict[str, Any], model: str, base: Any, pushed: Any, tol: float,
           c0: str | None, c1: str | None, torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    eng.update_weights_from_disk(model, weight_version="original")
    reloads: list[str] = []
    post = eng._control.post
    eng._control.post = lambda path, body, **kw: (reloads.append(path), post(path, body, **kw))[1]
    try:
        t = time.monotonic()
        with eng.paused():
            released_s = time.monotonic() - t
            hog = torch.empty(1 << 30, dtype=torch.uint8, device=trainer.device)  # the training step's memory
            del hog
            t_push = time.monotonic()
            eng.update_weights(trainer, weight_version="paused-full")
            push_s = time.monotonic() - t_push
        res = eng.score(TEXTS, COMPLETIONS)
        out["full_inside"] = {"block_s": time.monotonic() - t, "release_s": released_s, "push_s": push_s,
                              "reloaded_from_disk": reloads.count("/update_weights_from_disk"), **diff(pushed, res.logprobs),
                              "equal": diff(pushed, res.logprobs)["max"] <= tol,
                              "rows_version": sorted(set(res.df.weight_version)), "checksum_equal": same(checksum(eng), c1)}

        norms = {n: (t.float() * 1.3).to(t.dtype) for n, t in originals.items() if "norm" in n}
        eng.update_weights_from_disk(model, weight_version="original")
        eng.update_weights(norms)
        norms_outside = score(eng)
        eng.update_weights_from_disk(model, weight_version="original")
        reloads.clear()
        with eng.paused():
            eng.update_weights(norms, weight_version="paused-norms")
        out["partial_inside"] = {"reloaded_from_disk": reloads.count("/update_weights_from_disk"),
                                 **diff(norms_outside, score(eng)), "moved_from_base": diff(base, norms_outside)["max"]}

        with eng.paused():
            pass
        eng.update_weights(trainer, weight_version="after-paused")
        out["push_after_block"] = {**diff(pushed, score(eng)), "checksum_equal": same(checksum(eng), c1)}

        with eng.paused():  # no push: the checkpoint comes back, under its own version
            pass
        res = eng.score(TEXTS, COMPLETIONS)
        out["pause_without_push"] = {**diff(base, res.logprobs), "rows_version": sorted(set(res.df.weight_version)),
                                     "checksum_equal": same(checksum(eng), c0)}
    finally:
        eng._control.post = post
    return out


def refusals(eng: Any, originals: dict[str, Any], torch: Any) -> dict[str, Any]:
    import rlgen
    from rlgen.client._tensors import Transport, bucket_body

    out: dict[str, Any] = {}
    cases = {"cpu_tensors": {n: t.cpu() for n, t in originals.items()},
             "unknown_name": {"model.layers.0.self_attn.q_proj.weigth": originals["model.layers.0.self_attn.q_proj.weight"]}}
    for name, weights in cases.items():
        try:
            eng.update_weights(weights)
            out[name] = "not refused"
        except rlgen.WeightsError as e:
            out[name] = str(e)
    if torch.cuda.is_available() and eng.backend == "sglang":
        # SGLang's own answer to a name its model does not have (rlgen refuses it before sending).
        body = bucket_body([("model.not_a_weight", torch.ones(3, device="cuda", dtype=torch.bfloat16))],
                           transport=Transport.IPC, flatten=False, tp_size=1, flush_cache=True, weight_version=None)
        status, raw = C.http_request(eng.url, "/update_weights_from_tensor", body, timeout=120)
        log = Path(eng._server.log_path).read_text(errors="replace")
        out["sglang_unknown_name"] = {"status": status, "answer": raw.decode(errors="replace")[:300],
                                      "logged_not_found": "model.not_a_weight not found in params_dict" in log,
                                      "alive": eng._server.alive()}
    return out


def shape_mismatch(eng: Any, torch: Any) -> dict[str, Any]:
    """A raw push of a tensor of the wrong shape (rlgen refuses it): SGLang's weight loader asserts
    inside the scheduler. Last, since it may take the server down."""
    if not (torch.cuda.is_available() and eng.backend == "sglang"):
        return {"skipped": "SGLang only"}
    from rlgen.client._tensors import Transport, bucket_body

    body = bucket_body([("model.norm.weight", torch.ones(7, device="cuda", dtype=torch.bfloat16))],
                       transport=Transport.IPC, flatten=False, tp_size=1, flush_cache=True, weight_version=None)
    try:
        status, raw = C.http_request(eng.url, "/update_weights_from_tensor", body, timeout=60)
        answer = raw.decode(errors="replace")[:300]
    except Exception as e:
        status, answer = None, repr(e)
    time.sleep(5)
    return {"status": status, "answer": answer, "server_alive_after": eng._server.alive(),
            "log_tail": Path(eng._server.log_path).read_text(errors="replace")[-1500:]}


# ---- report ------------------------------------------------------------------------------------------


def report(record: C.Record) -> None:
    phases = record.data.get("phases", {})
    noise = phases.get("noise", {})
    print(f"\nSGLang run-to-run noise on {len(TEXTS)} texts: max |Δlogprob| {C.fmt(noise.get('max_abs_between_runs'), '.2e')}"
          f" (tolerance {C.fmt(noise.get('tolerance'), '.2e')}); checksum available: {noise.get('checksum') is not None}")
    checks = []
    ident = phases.get("identical", {})
    for label in ("bf16", "fp32"):
        if label in ident:
            checks.append((f"identical push ({label}) keeps logprobs / checksum",
                           ident[label]["max"] <= noise.get("tolerance", 0), ident[label].get("checksum_equal")))
    pert = phases.get("perturbed", {})
    if pert:
        checks.append(("perturbed push moves logprobs", pert["moved_from_base"]["max"] > 0.05, pert.get("checksum_changed")))
        checks.append(("push == update_weights_from_disk of the same weights", pert["push_equals_disk"],
                       pert.get("checksum_push_equals_disk")))
    if "restore" in phases:
        r = phases["restore"]
        checks.append(("originals pushed back restore", r["max"] <= noise.get("tolerance", 0), r.get("checksum_equal")))
    for name, b in phases.get("buckets", {}).items():
        checks.append((f"buckets {name} ({b['requests']} requests) == one request", b["max"] <= noise.get("tolerance", 0),
                       b.get("checksum_equal")))
    p = phases.get("paused", {})
    if p:
        full = p["full_inside"]
        checks.append((f"push inside paused() (disk reloads: {full['reloaded_from_disk']})", full["equal"],
                       full.get("checksum_equal")))
        part = p["partial_inside"]
        checks.append((f"partial push inside paused() (disk reloads: {part['reloaded_from_disk']})",
                       part["max"] <= noise.get("tolerance", 0), None))
        checks.append(("push after paused()", p["push_after_block"]["max"] <= noise.get("tolerance", 0),
                       p["push_after_block"].get("checksum_equal")))
        checks.append((f"pause without push: checkpoint back as {p['pause_without_push']['rows_version']}",
                       p["pause_without_push"]["max"] <= noise.get("tolerance", 0), p["pause_without_push"].get("checksum_equal")))
    fresh = phases.get("fresh", {})
    if fresh:
        checks.append(("push == fresh server on the same weights saved to disk", fresh["push_equals_fresh"],
                       fresh.get("checksum_push_equals_fresh")))
    C.print_table("Checks (logprobs within noise; checksum equal)", ["check", "logprobs", "checksum"],
                  [[name, C.verdict(ok), C.verdict(cs)] for name, ok, cs in checks])
    rows = []
    for name, t in phases.get("timing", {}).items():
        interval = t.get("interval_s")
        rows.append([name, str(len(t["runs"])), C.fmt(t["median_s"], ".3f"),
                     "-" if not interval else f"{interval[0]:.3f}-{interval[1]:.3f}",
                     C.fmt(t.get("notebook_peak_extra_mib"), ",.0f")])
    if rows:
        C.print_table("Seconds per update (medians, 90% bootstrap interval)",
                      ["method", "runs", "median", "interval", "notebook peak extra MiB"], rows)
    for name in ("refusals", "shape_mismatch"):
        if name in phases:
            print(f"{name}: {json.dumps(phases[name], default=str)[:1200]}", flush=True)


if __name__ == "__main__":
    main()
