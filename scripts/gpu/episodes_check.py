"""Calculator-tool episodes through rlgen's Engine: statuses, success, drift, concurrency, prefix cache.

Owns the GPU proof of `Engine.episodes` on a real task: the calculator task of
../shared/research/multi-turn.md §6 (a system prompt naming the tool, one demo exchange in the
history, questions with known answers; T=0.7, stop at `</tool_call>`, 48 tokens a turn, up to 4
turns, 16 prompts x 8 episodes), its safe `calculate` tool, and the summary written to --out. Two
variants, one after the other on the same server:

    hermes   `tool_env([calculate])`: rlgen's built-in hermes parser
    server   `tool_env([calculate], parser="server")`: the server's own hermes parser through
             /parse_function_call, with the Engine's client; afterwards every assistant turn is
             read by both the server and `parse_hermes`, and the two readings are compared
             (`parser_agreement`).

Per variant: statuses, success (the episode ended "done" and its last assistant message holds the
right number), turns, tool calls, the drift check (`rlgen.episodes.drift(tokenizer, messages, ids,
roles=..., tools=...)` per record, `drift_summary` by cause, the first few divergences), and
concurrency: every episode in flight at once (max_in_flight = episodes), the peak of requests in
flight seen by `RequestLog` (bench/episodes.py), wall time, s/episode, cached_share of turns 2...

    python scripts/gpu/episodes_check.py --backend sglang --out $OUT/episodes_check.json   # GPU machine
    python scripts/gpu/episodes_check.py --backend cpu --quick --out /tmp/episodes_check.json
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
import _common as C  # noqa: E402
from episodes import RequestLog  # noqa: E402  (bench/episodes.py)

SYSTEM = ('You are a helpful assistant with a calculator. To use it, write <tool_call>{"name": "calculate", '
          '"arguments": {"expression": "..."}}</tool_call> and wait for the result. Then give the final answer.')
DEMO = [
    {"role": "user", "content": "What is 17 * 23?"},
    {"role": "assistant", "content": '<tool_call>{"name": "calculate", "arguments": {"expression": "17 * 23"}}</tool_call>'},
    {"role": "tool", "name": "calculate", "content": "391"},
    {"role": "assistant", "content": "17 * 23 = 391."},
]
STOP = "</tool_call>"
SIZES = {"full": {"prompts": 16, "n": 8, "max_new_tokens": 48, "max_turns": 4},
         "quick": {"prompts": 2, "n": 2, "max_new_tokens": 24, "max_turns": 3}}

_OPS: dict[type, Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                               ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
                                               ast.Mod: operator.mod, ast.Pow: operator.pow}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 16:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: an arithmetic expression such as '12 * 7'
    """
    value = _eval(ast.parse(expression.replace("x", "*").replace("×", "*"), mode="eval"))
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def questions(count: int, *, seed: int = 11) -> tuple[list[list[dict[str, str]]], list[str]]:
    """`count` chats (system prompt, the demo exchange, one question) and their answers: mostly
    products of two 2-3 digit numbers (the model calls the tool almost only for those), some sums."""
    rng = random.Random(seed)
    chats, answers = [], []
    for i in range(count):
        a, b = rng.randrange(12, 400), rng.randrange(12, 99)
        op, value = ("+", a + b) if i % 4 == 3 else ("*", a * b)
        chats.append([{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": f"What is {a} {op} {b}?"}])
        answers.append(str(value))
    return chats, answers


def succeeded(record: Any, answer: str) -> bool:
    """Ended "done" with the right number in its last assistant message (thousands separators ignored)."""
    last = next((m["content"] for m in reversed(record.messages) if m.get("role") == "assistant"), "")
    return record.status == "done" and re.search(rf"(?<![\d.]){answer}(?![\d])", last.replace(",", "")) is not None


def parser_agreement(url: str, tools: list[Any], texts: list[str]) -> dict[str, Any]:
    """How the server's /parse_function_call (hermes) and rlgen's own parse_hermes read the same
    assistant turns: turns read alike (same calls, and both or neither finding a problem)."""
    from parse_parity import post

    from rlgen.episodes import parse_hermes

    wire = [{"type": "function", "function": {k: t["function"][k] for k in ("name", "description", "parameters")
                                              if k in t["function"]}} for t in tools]
    agreement: dict[str, Any] = {"turns": 0, "same": 0, "same_calls": 0, "examples": []}
    ms = []
    for text in texts:
        t0 = time.perf_counter()
        status, answer = post(url, "/parse_function_call",
                              {"text": text, "tools": wire, "tool_call_parser": "hermes"})
        ms.append(1e3 * (time.perf_counter() - t0))
        if status != 200 or not isinstance(answer, dict):
            raise RuntimeError(f"/parse_function_call answered HTTP {status}: {answer!r}")
        served = [(c["name"], json.loads(c["parameters"] or "{}")) for c in answer["calls"]]
        local = parse_hermes(text)
        same_calls = served == [(c.name, c.arguments) for c in local.calls]
        # a problem: the server saw a call marker but returned no call; rlgen's parser named an error
        same = same_calls and ("<tool_call>" in text and not served) == (local.error is not None)
        agreement["turns"] += 1
        agreement["same"] += same
        agreement["same_calls"] += same_calls
        if not same and len(agreement["examples"]) < 12:
            agreement["examples"].append({"text": text, "server": answer,
                                          "hermes": {"calls": [(c.name, c.arguments) for c in local.calls],
                                                     "error": local.error}})
    agreement["server_parse_ms_median"] = statistics.median(ms) if ms else None
    return agreement


def run_variant(eng: Any, name: str, chats: list[Any], answers: list[str], size: dict[str, int]) -> dict[str, Any]:
    from rlgen.episodes import drift, drift_summary, tool_env

    # "server": the server's own parser through /parse_function_call, with the Engine's client
    env = tool_env([calculate], parser="server" if name == "server" else "hermes")
    episodes = len(chats) * size["n"]
    log = RequestLog(eng._client)
    C.log(f"{name}: {episodes} episodes, all in flight ...")
    t0 = time.perf_counter()
    with log.installed(eng):
        res = eng.episodes(chats, env=env, n=size["n"], max_turns=size["max_turns"],
                           max_new_tokens=size["max_new_tokens"], temperature=0.7, stop=[STOP], progress=False,
                           max_in_flight=episodes)
    wall = time.perf_counter() - t0
    df = res.df
    records = res.records
    ok = [succeeded(r, answers[r.prompt_index]) for r in records]
    by_prompt: dict[int, list[bool]] = {}
    for r, good in zip(records, ok):
        by_prompt.setdefault(r.prompt_index, []).append(good)
    calls = [sum(int(t.get("tool_calls") or 0) for t in r.turns if t.get("role") == "env") for r in records]
    drifts = []
    drift_errors = []
    for r in records:
        try:
            drifts.append(drift(eng.tokenizer, r.messages, r.ids, roles=r.roles, tools=env.schemas))
        except Exception as err:  # one episode's failure to compare is reported, not fatal
            drift_errors.append(f"episode {r.prompt_index}/{r.sample_index}: {type(err).__name__}: {err}")
    summary = drift_summary(drifts) if drifts else None
    cached = [float(x) for x in df["cached_share"] if x is not None and x == x]
    out = {
        "episodes": episodes, "wall_s": wall, "s_per_episode": wall / episodes,
        "statuses": dict(Counter(str(s) for s in df["status"])),
        "success": sum(ok), "success_rate": sum(ok) / len(ok) if ok else None,
        "prompt_groups_varying": sum(0 < sum(v) < len(v) for v in by_prompt.values()),
        "turns": dict(Counter(int(t) for t in df["turns"])), "mean_turns": float(df["turns"].mean()),
        "sampled_tokens": int(df["sampled_tokens"].sum()),
        "episodes_with_tool_calls": sum(c > 0 for c in calls), "tool_calls": sum(calls),
        "concurrency": {"max_in_flight": episodes, "peak_in_flight": log.peak, "requests": len(log.sizes)},
        "cached_share": {"mean": statistics.fmean(cached) if cached else None,
                         "median": statistics.median(cached) if cached else None, "episodes": len(cached)},
        "drift": {
            "by_cause": summary.reset_index().to_dict("records") if summary is not None else None,
            "errors": drift_errors,
            "first_divergences": [{"episode": f"{r.prompt_index}/{r.sample_index}", "drift": repr(d),
                                   "ids_tokens": list(d.ids_tokens), "render_tokens": list(d.render_tokens)}
                                  for r, d in zip(records, drifts) if not d.same][:8],
        },
        "errors": [f"{r.prompt_index}/{r.sample_index} {r.status}: {r.error}" for r in records if r.error][:12],
        "examples": [{"status": r.status, "success": good, "messages": r.messages[len(chats[r.prompt_index]):]}
                     for r, good in list(zip(records, ok))[:: max(1, len(records) // 6)]][:6],
    }
    if name == "server":
        texts = [t["text"] or "" for r in records for t in r.assistant_turns]
        out["parser_agreement"] = parser_agreement(eng.url, env.schemas, texts)
    C.log(f"{name}: {out['statuses']}, success {out['success']}/{episodes}, peak in flight {log.peak}, "
          f"{wall:.1f} s")
    return out


def report(data: dict[str, Any]) -> None:
    rows = []
    for name, v in (data.get("variants") or {}).items():
        if "error" in v:
            rows.append([name, "ERROR " + v["error"][:80]] + [""] * 8)
            continue
        causes = {row["cause"]: row["episodes"] for row in v["drift"]["by_cause"] or [] if row["cause"] != "all"}
        rows.append([name, ",".join(f"{k}={n}" for k, n in v["statuses"].items()),
                     f"{v['success']}/{v['episodes']} ({100 * v['success_rate']:.1f}%)", str(v["prompt_groups_varying"]),
                     f"{v['mean_turns']:.2f}", str(v["tool_calls"]),
                     ",".join(f"{k}={n}" for k, n in causes.items() if n),
                     f"{v['concurrency']['peak_in_flight']}/{v['concurrency']['max_in_flight']}",
                     C.fmt(v["cached_share"]["mean"], ".3f"), f"{v['s_per_episode']:.3f}"])
    C.print_table("calculator-tool episodes (statuses; success = done with the right number; groups: prompts whose "
                  "episodes differ in success; drift: episodes by the cause of their first divergence; peak: "
                  "requests in flight / allowed; cached: mean cached_share of turns 2..)",
                  ["parser", "statuses", "success", "groups", "turns", "calls", "drift", "peak", "cached", "s/ep"], rows)
    agreement = (data.get("variants") or {}).get("server", {}).get("parser_agreement")
    if agreement:
        print(f"  server parser vs rlgen's parse_hermes on the same turns: {agreement['same']}/{agreement['turns']} "
              f"read alike ({agreement['same_calls']} with the same calls); a server parse took "
              f"{C.fmt(agreement['server_parse_ms_median'], '.2f')} ms (median)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("sglang", "cpu"), default="sglang")
    ap.add_argument("--model", default=None)
    ap.add_argument("--quick", action="store_true", help="2 prompts x 2, short turns: a smoke run")
    ap.add_argument("--variants", default="hermes,server")
    args = ap.parse_args()
    import rlgen

    if args.backend == "sglang":
        C.site_flags()
    model = C.model_path(args.model)
    size = SIZES["quick" if args.quick else "full"]
    names = C.subset(ap, "--variants", args.variants, ("hermes", "server"))
    data: dict[str, Any] = {"script": "scripts/gpu/episodes_check.py", "args": vars(args),
                            "environment": C.environment(), "model": model, "sizes": size, "system": SYSTEM,
                            "demo": DEMO, "stop": STOP, "temperature": 0.7, "variants": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(data, indent=1, default=str, ensure_ascii=False))

    chats, answers = questions(size["prompts"])
    data["questions"] = [c[-1]["content"] for c in chats]
    data["answers"] = answers
    C.log(f"starting rlgen.Engine({model!r}, backend={args.backend!r}) ...")
    t0 = time.monotonic()
    server_args = {"tool_call_parser": "hermes"} if args.backend == "sglang" else None
    eng = rlgen.Engine(model, backend=args.backend, progress=False, server_args=server_args,
                       log_dir=C.logs_dir(args.out, "server"))
    try:
        data["server"] = {"start_s": time.monotonic() - t0, "argv": eng.info.get("command"), "url": eng.url}
        C.log(f"server ready in {data['server']['start_s']:.1f} s")
        save()
        for name in names:
            try:
                data["variants"][name] = run_variant(eng, name, chats, answers, size)
            except Exception as err:  # the other variant still runs
                import traceback

                data["variants"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                C.log(f"{name}: FAILED: {data['variants'][name]['error']}")
            save()
    finally:
        eng.close()
    report(data)
    data["complete"] = True
    save()
    C.log(f"wrote {out.resolve()}")
    return 0 if all("error" not in v for v in data["variants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
