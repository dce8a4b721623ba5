"""Request size: generate()'s default (about 16 requests per call) vs one request of up to 256 prompts.

Not a test. generate(chunk_size=None) splits a call into about 16 requests so that its progress
line advances as requests are answered; before, a call of up to 256 prompts was one request. This
measures what the split costs, side by side on one server: for each workload,

    auto    eng.generate(prompts)                  chunk_size=None: ceil(prompts / 16) prompts each
    one     eng.generate(prompts, chunk_size=256)  the old default

interleaved (a fresh shuffle per round, a prefix-cache flush before each run), the DataFrame and
tensors built as a user would. Workloads:

    a   256 prompts x 64 tokens -> 128 new, ignore_eos   (16 requests of 16 vs 1 of 256)
    b   2048 prompts x 64 tokens -> 128 new, ignore_eos  (16 of 128 vs 8 of 256)
    c   512 chat prompts -> up to 128 new, natural stops, temperature 1   (16 of 32 vs 2 of 256)

Metric: generated tokens/s; verdict on auto / one >= 0.95 (90% bootstrap interval of the ratio of
medians: PASS, FAIL, or NOISE where it straddles the bound).

    python bench/request_size.py --out request_size.json                 # on the GPU machine
    python bench/request_size.py --out /tmp/r.json --backend cpu --quick # smoke test anywhere
"""

from __future__ import annotations

import _common as C


def main() -> None:
    ap = C.base_parser(__doc__, repeats=7)
    C.add_report_only(ap)
    args = ap.parse_args()
    if C.reported_again(args, report):
        return
    import rlgen

    record = C.Record(args.out, args, "bench/request_size.py")
    model = C.model_path(args.model)
    quick = args.quick
    workloads = [
        C.token_workload("a", 16 if quick else 256, 64, 8 if quick else 128),
        C.token_workload("b", 32 if quick else 2048, 64, 8 if quick else 128),
        C.chat_workload("c", 16 if quick else 512, 8 if quick else 128, model),
    ]
    if args.backend == "sglang":
        C.site_flags()  # sets $RLGEN_SGLANG_ARGS, which the Engine reads
    with rlgen.Engine(model, backend=args.backend, progress=False) as eng:
        record["server"] = {"url": eng.url, "backend": eng.backend}
        results: dict[str, object] = {}
        for wl in workloads:
            C.log(f"workload {wl.name}: {wl.n_samples} samples")
            methods = {
                "auto": lambda w: C.rlgen_generate(eng, w),
                "one": lambda w: C.rlgen_generate(eng, w, chunk_size=C.CHUNK_SIZE),
            }
            per = C.run_interleaved(methods, wl, repeats=C.repeats_of(args), warmup=wl.head(min(64, len(wl.prompts))),
                                    before_each=lambda: C.flush_cache(eng.url), label=f"{wl.name}: ")
            results[wl.name] = {"workload": wl.summary(), "methods": per}
            record["results"] = results
            record.save()
    report(record)
    record.save(complete=True)


def report(record: C.Record) -> None:
    targets = C.Targets()
    rows = []
    for name, result in record["results"].items():
        per = result["methods"]
        cmp = C.compare(per, "auto", ["one"])
        rows.append([name, str(result["workload"]["samples"]), f"{per['auto']['median_tok_s'] or 0:,.0f}",
                     f"{per['one']['median_tok_s'] or 0:,.0f}", f"{cmp['ratio'] or float('nan'):.3f}"])
        targets.check_interval(f"{name}: auto / one request", cmp["ratio"], cmp["interval"], 0.95)
    C.print_table("generate(): about 16 requests per call vs up to 256 prompts per request (tokens/s, medians)",
                  ["workload", "samples", "auto", "one", "ratio"], rows)
    record["targets"] = targets.rows


if __name__ == "__main__":
    main()
