"""verifiers v0 environments through `rlgen.envs.from_verifiers`: their own rollout loop, rlgen as
their model client, token in and token out.

Without a server (a scripted client answers `/generate`): the documented `vf.ToolEnv` example's ids
(first prompt, sampled turns, closing EOS, deltas) and verifiers' own trajectory tokens, the
rubric's reward and metrics as reward columns, what verifiers' re-render of its own messages would
give (the drift inspector says where), history the environment rewrites, every way an episode
ends (statuses, errors, tracebacks), `adapt`. On the CPU backend: the documented tool example and a
custom `MultiTurnEnv` through `Engine.episodes(env=vf_env)`, the model calling the tool.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest
import verifiers as vf
from datasets import Dataset

import rlgen
from rlgen import episodes
from rlgen.envs import adapt, from_verifiers
from rlgen.envs._verifiers import looks_like_verifiers
from rlgen.episodes._runner import episode_prompts

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
DATASET = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 2+2?"}], "answer": "4"}])
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "%s"}}</tool_call>'
SYSTEM = ('You are a helpful assistant with a calculator. To use it, write <tool_call>{"name": "calculate", '
          '"arguments": {"expression": "..."}}</tool_call> and wait for the result. Then give the final answer.')
DEMO = [
    {"role": "user", "content": "What is 17 * 23?"},
    {"role": "assistant", "content": CALL % "17 * 23"},
    {"role": "tool", "tool_call_id": "call_demo", "name": "calculate", "content": "391"},
    {"role": "assistant", "content": "The answer is 391."},
]


# ---- verifiers' documented examples (docs/v0/environments.md), unchanged ------------------------------

async def calculate(expression: str) -> str:
    """Evaluate a mathematical expression.

    Args:
        expression: A mathematical expression to evaluate (e.g. "2 + 2 * 3")

    Returns:
        The result of the evaluation.
    """
    try:
        result = eval(expression)
        return str(result)
    except Exception as e:
        return f"Error: {e}"


async def correct_answer(completion, answer) -> float:  # type: ignore[no-untyped-def]
    response = completion[-1]["content"]
    return 1.0 if answer in response else 0.0


def tool_env(**kwargs: Any) -> Any:
    return vf.ToolEnv(dataset=DATASET, tools=[calculate], rubric=vf.Rubric(funcs=[correct_answer]), max_turns=10,
                      **kwargs)


class Faulty(vf.MultiTurnEnv):
    """A custom multi-turn environment whose reply is named by the row's answer."""

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        what = state["answer"]
        if what == "boom":
            raise RuntimeError("the environment broke")
        if what == "tool_parse":
            raise vf.ToolParseError("could not read the call") from ValueError("bad JSON")
        if what == "sandbox":
            raise vf.SandboxError("the sandbox is down")
        if what == "slow":
            await asyncio.sleep(30)
        if what == "final":
            state["final_env_response"] = [{"role": "user", "content": "Well done."}]
            return state["final_env_response"]  # type: ignore[no-any-return]
        if what == "nothing":
            return []
        return [{"role": "user", "content": "Go on."}]


async def said_something(completion) -> float:  # type: ignore[no-untyped-def]
    return float(any(m["role"] == "assistant" and m["content"] for m in completion))


def faulty(**kwargs: Any) -> Faulty:
    return Faulty(dataset=DATASET, rubric=vf.Rubric(funcs=[said_something]), **kwargs)


# ---- a scripted server ---------------------------------------------------------------------------------

class Scripted:
    """Answers `/generate` with `reply(the request's text)` + EOS, each token at logprob -0.5."""

    def __init__(self, tok: Any, reply: Callable[[str], str]) -> None:
        self.tok, self.reply, self.payloads = tok, reply, []

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.payloads.append(payload)
        text = self.reply(self.tok.decode(payload["input_ids"]))
        ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
        return {"text": text, "output_ids": ids, "meta_info": {
            "id": payload["rid"], "finish_reason": {"type": "stop"}, "prompt_tokens": len(payload["input_ids"]),
            "output_token_logprobs": [[-0.5, i, None] for i in ids]}}

    async def abort(self, rids: list[str]) -> None:
        return None


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(rlgen.resolve_model(None).path)


def run(tok: Any, env: Any, prompts: list[Any], reply: Callable[[str], str], **kwargs: Any,
        ) -> tuple[list[episodes.EpisodeRecord], Scripted]:
    client = Scripted(tok, reply)
    options = {"n": 1, "max_turns": 3, "batch_turns": False, **kwargs}
    chats = episode_prompts(prompts)
    records = asyncio.run(episodes.run_episodes(client, tok, chats, env=env, **options))  # type: ignore[arg-type]
    return records, client


def calculator(text: str) -> str:
    """Calls the calculator once, then answers with what the tool said."""
    if "<|im_start|>tool" not in text.rsplit("<|im_start|>user", 1)[-1]:
        return CALL % "2 + 2"
    return "The answer is " + text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0] + "."


# ---- without a server ----------------------------------------------------------------------------------

def test_the_documented_tool_env_runs_token_in_token_out_and_its_rubric_is_the_reward(tok: Any) -> None:
    vf_env = tool_env()
    env = from_verifiers(vf_env, parser="hermes")
    chat = [{"role": "user", "content": "What is 2+2?"}]
    (r,), client = run(tok, env, [chat], calculator, data={"answer": ["4"]})
    assert r.status == "done" and r.error is None, r
    tools = env.tools
    assert tools is not None and tools[0]["function"]["name"] == "calculate"
    # the ids: first prompt (with the tools), turn 0 as sampled, the tool's delta, turn 1 as sampled
    sampled = client.payloads
    first = episodes.first_prompt_ids(tok, chat, tools=tools)
    turn0 = [*tok.encode(CALL % "2 + 2", add_special_tokens=False), tok.eos_token_id]
    turn1 = [*tok.encode("The answer is 4.", add_special_tokens=False), tok.eos_token_id]
    delta = episodes.message_delta_ids(tok, [{"role": "tool", "content": "4", "tool_call_id": "call_0_0_0_0"}],
                                       tools=tools)
    assert r.ids == first + turn0 + delta + turn1
    assert sampled[0]["input_ids"] == first and sampled[1]["input_ids"] == first + turn0 + delta
    assert r.loss_mask == [0] * len(first) + [1] * len(turn0) + [0] * len(delta) + [1] * len(turn1)
    assert [lp for lp, m in zip(r.logprobs, r.loss_mask) if m] == [-0.5] * (len(turn0) + len(turn1))
    assert r.turn_ids == [0] * (len(first) + len(turn0) + len(delta)) + [1] * len(turn1)
    assert r.messages[-1] == {"role": "assistant", "content": "The answer is 4."}
    assert episodes.drift(tok, r.messages, r.ids, roles=r.roles, tools=tools).same
    # verifiers' own trajectory holds the very ids rlgen sent and sampled
    state = r.env
    steps = state["trajectory"]
    assert [s["tokens"]["prompt_ids"] for s in steps] == [first, first + turn0 + delta]
    assert [s["tokens"]["completion_ids"] for s in steps] == [turn0, turn1]
    assert steps[0]["tokens"]["completion_logprobs"] == [-0.5] * len(turn0)
    call = steps[0]["completion"][0].tool_calls[0]
    assert (call.id, call.name, call.arguments) == ("call_0_0_0_0", "calculate", '{"expression": "2 + 2"}')
    assert steps[0]["response"].message.finish_reason == "tool_calls" and state["stop_condition"] == "no_tools_called"
    # the turns: the call and its answer in the env turn, then the end
    kinds = [(t["role"], t["turn"]) for t in r.turns]
    assert kinds == [("assistant", 0), ("env", 0), ("assistant", 1), ("env", 1)]
    assert r.turns[1]["calls"] == [{"id": "call_0_0_0_0", "name": "calculate", "arguments": {"expression": "2 + 2"},
                                    "status": "answered", "result": "4"}]
    assert r.turns[1]["tokens"] == len(delta) and r.turns[3]["done"] and r.turns[3]["info"] == {
        "stop_condition": "no_tools_called"}
    # the rubric's reward and metrics, as Engine.episodes adds them
    res = episodes.episodes_from_records([r], pad_token_id=0, tokenizer=tok, tools=tools)
    scored = res.add_rewards(dict(env.reward_funcs or {}), mode="thread")
    row = scored.df.iloc[0]
    assert state["reward"] == 1.0 and row["reward_ToolEnv"] == 1.0 and row["reward"] == 1.0
    assert row["reward_ToolEnv_correct_answer"] == 1.0 and row["reward_ToolEnv_total_tool_calls"] == 1.0
    assert row["reward_ToolEnv_num_turns"] == 2.0 and row["reward_ToolEnv_calculate_calls"] == 1.0
    assert res.check_drift().df["drift"].tolist() == ["same"]


def test_verifiers_own_rerender_of_its_messages_drifts_where_the_call_was_taken_out(tok: Any) -> None:
    env = from_verifiers(tool_env(), parser="hermes")
    chat = [{"role": "user", "content": "What is 2+2?"}]
    (r,), _ = run(tok, env, [chat], calculator)
    state = r.env
    # what a trainer rendering verifiers' messages gets: the assistant's call is in tool_calls,
    # not in the text the model sampled
    theirs = [{"role": m.role, "content": m.content or ""} for m in [*state["prompt"], *state["completion"]]]
    d = episodes.drift(tok, theirs, r.ids, roles=r.roles, tools=env.tools)
    assert not d.same and d.role == "assistant" and d.turn == 1, d
    assert d.position == r.prompt_len  # the first sampled token
    assert episodes.drift(tok, r.messages, r.ids, roles=r.roles, tools=env.tools).same


class Rewrites(vf.MultiTurnEnv):
    """Rewrites the first user message of the history it sends for the second turn."""

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        return [{"role": "user", "content": "And now?"}]

    async def get_prompt_messages(self, state: vf.State) -> vf.Messages:
        messages = await super().get_prompt_messages(state)
        if state["trajectory"]:
            messages = [vf.UserMessage(content="REWRITTEN"), *messages[1:]]
        return messages


def test_history_the_environment_rewrites_is_recorded_as_drift_and_never_sent(tok: Any) -> None:
    env = from_verifiers(Rewrites(dataset=DATASET, max_turns=2), parser="hermes")
    (r,), client = run(tok, env, ["What is 2+2?"], lambda text: "Four.")
    assert r.status == "max_turns" and r.env["stop_condition"] == "max_turns_reached", r
    said = [t for t in r.turns if t["role"] == "env"]
    assert said[0]["info"] == {"rewritten_history": [0]} and said[0]["text"] == "And now?"
    # the ids keep what was sent: the first request's prompt, never re-tokenized
    first = episodes.first_prompt_ids(tok, [{"role": "user", "content": "What is 2+2?"}])
    assert client.payloads[1]["input_ids"][:len(first)] == first
    assert r.messages[0] == {"role": "user", "content": "REWRITTEN"}
    d = episodes.drift(tok, r.messages, r.ids, roles=r.roles)
    assert not d.same and d.turn == 0 and d.position is not None and d.position < len(first), d
    res = episodes.episodes_from_records([r], pad_token_id=0, tokenizer=tok).check_drift()
    assert res.df["drift"].tolist() != ["same"] and res.df["drift_turn"].tolist() == [0]


def test_each_way_an_episode_ends_is_its_own_status_and_the_others_go_on(tok: Any) -> None:
    ends = ["ok", "boom", "tool_parse", "sandbox", "slow", "final", "nothing"]
    env = from_verifiers(faulty(), parser="hermes", timeout=1.0)
    records, _ = run(tok, env, [f"Say {e}." for e in ends], lambda text: "Fine.", n=2,
                     data={"answer": ends}, max_turns=2)
    by = {(r.data["answer"], r.sample_index): r for r in records}
    assert {a: by[a, 0].status for a in ends} == {
        "ok": "max_turns", "boom": "env_error", "tool_parse": "bad_tool_call", "sandbox": "env_error",
        "slow": "env_timeout", "final": "done", "nothing": "bad_env_return"}
    assert all(by[a, 0].status == by[a, 1].status for a in ends)
    boom = by["boom", 0]
    assert boom.error == "RuntimeError: the environment broke" and "Traceback" in (boom.traceback or "")
    assert "env_response" in (boom.traceback or "") and len(boom.assistant_turns) == 1
    assert by["tool_parse", 0].error == "ToolParseError: could not read the call (from ValueError: bad JSON)"
    assert "Traceback" in (by["tool_parse", 0].traceback or "")
    assert by["sandbox", 0].error == "SandboxError: the sandbox is down"
    assert "within 1 s" in (by["slow", 0].error or "")
    assert "returned []" in (by["nothing", 0].error or "")
    ok = by["ok", 0]
    assert ok.error is None and len(ok.assistant_turns) == 2 and ok.turns[-1]["role"] == "env"
    assert ok.turns[-1]["text"] == "Go on." and ok.turns[-1]["tokens"] == 0  # the reply after the last turn: not sent
    assert ok.env["stop_condition"] == "max_turns_reached" and not ok.env["prompt_too_long"]  # rlgen's max_turns
    assert by["final", 0].turns[-1]["info"] == {"stop_condition": "has_final_env_response"}
    # each failure is on the env turn that failed; the rubric scored every rollout that returned a state
    assert boom.turns[-1]["role"] == "env" and boom.turns[-1]["status"] == "env_error"
    assert by["slow", 0].env is not None and by["slow", 0].env.get("reward") is None  # cancelled: not scored
    assert by["boom", 0].env is None or by["boom", 0].env.get("reward") is None
    assert ok.env["reward"] == 1.0 and by["sandbox", 0].env["reward"] == 1.0
    for r in records:
        assert r.turns and r.ids and r.status != "running"


def test_a_rollout_that_times_out_while_its_request_is_in_flight_has_that_request_aborted(tok: Any) -> None:
    class Slow(Scripted):
        """The second prompt's request is not answered before the rollout's timeout."""

        def __init__(self, tok: Any) -> None:
            super().__init__(tok, lambda text: "Fine.")
            self.aborted: list[str] = []

        async def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
            if "Wait." in self.tok.decode(payload["input_ids"]):
                self.payloads.append(payload)
                await asyncio.sleep(30)
            return await super().generate(payload)

        async def abort(self, rids: list[str]) -> None:
            self.aborted.extend(rids)

    client = Slow(tok)
    env = from_verifiers(faulty(), parser="hermes", timeout=1.0)
    chats = episode_prompts(["Say ok.", "Wait."])
    records = asyncio.run(episodes.run_episodes(client, tok, chats, env=env, n=1, max_turns=2,  # type: ignore[arg-type]
                                                batch_turns=False, data={"answer": ["ok", "ok"]}))
    assert [r.status for r in records] == ["max_turns", "env_timeout"]
    waited = [p["rid"] for p in client.payloads if "Wait." in tok.decode(p["input_ids"])]
    assert len(waited) == 1 and client.aborted == waited  # the given-up request, and only it


def test_tool_errors_malformed_calls_and_max_turns_of_verifiers(tok: Any) -> None:
    ran: list[int] = []

    def lookup(n: int) -> str:
        """Look up a number.

        Args:
            n: the number.
        """
        ran.append(n)
        raise ValueError(f"no entry for {n}")

    vf_env = vf.ToolEnv(dataset=DATASET, tools=[lookup], rubric=vf.Rubric(funcs=[correct_answer]), max_turns=3,
                        stop_errors=[ValueError])
    env = from_verifiers(vf_env, parser="hermes")

    def reply(text: str) -> str:
        if "malformed" in text:
            return '<tool_call>{"name": "lookup", "arguments": {"n": 1</tool_call>'
        if "Think" in text:
            return '<think><tool_call>{"name": "lookup", "arguments": {"n": 3}}</tool_call></think>I will not look.'
        return '<tool_call>{"name": "lookup", "arguments": {"n": 7}}</tool_call>'

    records, _ = run(tok, env, ["Look up 7.", "A malformed call.", "Think first."], reply)
    failing, malformed, thought = records
    # a call written inside <think> is not read, so never run
    assert thought.status == "done" and thought.turns[-1]["info"] == {
        "calls_in_think": 1, "stop_condition": "no_tools_called"}, thought.turns
    assert thought.env["trajectory"][0]["completion"][0].content == "I will not look."
    assert failing.status == "tool_error" and ran == [7], failing
    assert failing.error == "ToolCallError (from ValueError: no entry for 7)"
    assert malformed.status == "bad_tool_call" and "malformed tool call" in (malformed.error or "")
    last = malformed.turns[-1]
    assert last["role"] == "env" and last["tool_calls_failed"] == 1
    assert last["calls"][0]["status"] == "bad_tool_call" and last["calls"][0]["parser"] == "hermes"
    assert malformed.env["trajectory"][0]["completion"][0].tool_calls is None  # never given to verifiers
    # verifiers' own max_turns
    always = from_verifiers(vf.ToolEnv(dataset=DATASET, tools=[calculate], max_turns=2), parser="hermes")
    (r,), _ = run(tok, always, ["Add."], lambda text: CALL % "1 + 1", max_turns=5)
    assert r.status == "max_turns" and len(r.assistant_turns) == 2 and r.env["stop_condition"] == "max_turns_reached"


class ParsingServer(Scripted):
    """Also answers `/parse_function_call` as SGLang's hermes parser does (the CPU backend's copy of it:
    a call to a tool not offered is dropped)."""

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        from rlgen.cpu_server._tool_parsers import parse_function_call

        assert path == "/parse_function_call"
        return parse_function_call(body)


@pytest.mark.parametrize("parser", ["server", "hermes"])
def test_a_call_to_a_tool_not_offered_is_answered_by_verifiers_and_the_episode_goes_on(tok: Any, parser: str) -> None:
    env = from_verifiers(tool_env(), parser=parser)

    def reply(text: str) -> str:
        if "<|im_start|>tool" not in text.rsplit("<|im_start|>user", 1)[-1]:
            return '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 2}}</tool_call>'
        return "I cannot multiply; the answer is 4."

    client = ParsingServer(tok, reply)
    chats = episode_prompts([[{"role": "user", "content": "What is 2*2?"}]])
    (r,) = asyncio.run(episodes.run_episodes(client, tok, chats, env=env, n=1, max_turns=3,  # type: ignore[arg-type]
                                             batch_turns=False, data={"answer": ["4"]}))
    # as verifiers' own loop: the call reaches ToolEnv.env_response, whose KeyError is the tool's answer
    assert r.status == "done" and r.error is None, (r.status, r.error)
    assert len(r.assistant_turns) == 2 and r.messages[2]["role"] == "tool" and r.messages[2]["content"] == "'multiply'"
    assert r.turns[1]["calls"][0]["name"] == "multiply" and r.turns[1]["calls"][0]["status"] == "answered"
    call = r.env["trajectory"][0]["completion"][0].tool_calls[0]
    assert (call.name, call.arguments) == ("multiply", '{"a": 2, "b": 2}')


def test_context_limit_budget_and_a_rubric_that_cannot_score(tok: Any) -> None:
    chat = [{"role": "user", "content": "What is 2+2?"}]
    first = len(episodes.first_prompt_ids(tok, chat))
    env = from_verifiers(faulty(), parser="hermes", sampling_args={"max_tokens": 5})
    (r,), client = run(tok, env, [chat], lambda text: "Fine.", max_new_tokens=8, context_length=first + 12,
                       data={"answer": ["ok"]})
    assert r.status == "context_limit" and "was not sent" in (r.error or ""), r
    assert [p["sampling_params"]["max_new_tokens"] for p in client.payloads] == [5]
    assert r.env["prompt_too_long"] is True and r.turns[-1]["text"] == "Go on." and r.turns[-1]["tokens"] == 0

    broken = faulty()

    async def cannot(states: list[Any]) -> None:
        raise KeyError("trajectory")

    broken.rubric.score_group = cannot  # type: ignore[method-assign]
    env = from_verifiers(broken, parser="hermes")
    (r,), _ = run(tok, env, [chat], lambda text: "Fine.", data={"answer": ["final"]})
    res = episodes.episodes_from_records([r], pad_token_id=0, tokenizer=tok)
    scored = res.add_rewards(dict(env.reward_funcs or {}), mode="thread", progress=False)
    assert r.status == "done" and scored.df["reward_Faulty_status"].tolist() == ["error"]
    assert "could not score the rollouts: KeyError" in scored.df["reward_Faulty_error"][0]


def test_adapt_recognises_a_verifiers_environment_instance() -> None:
    vf_env = tool_env()
    env = adapt(vf_env)
    assert isinstance(env, episodes.Environment) and env.loop is not None and env.kind == "framework"
    assert list(env.reward_funcs or {}) == ["ToolEnv"]
    assert looks_like_verifiers(vf_env) and not looks_like_verifiers(vf.ToolEnv) and not looks_like_verifiers(calculate)
    assert adapt(vf.ToolEnv) is vf.ToolEnv  # a class: left to as_environment, which refuses it
    with pytest.raises(TypeError, match="pass an instance"):
        from_verifiers(vf.ToolEnv)
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        from_verifiers(vf_env, parser="qwen")


# ---- on the CPU backend --------------------------------------------------------------------------------

PAIRS = [(36, 47), (243, 83)]
SAMPLING = dict(n=2, max_turns=3, max_new_tokens=48, temperature=0.7, stop=["</tool_call>"], sampling_seed=0)


@pytest.fixture(scope="module")
def engine(model_path: str):  # type: ignore[no-untyped-def]
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


@pytest.mark.timeout(300)
def test_the_documented_tool_env_on_the_cpu_backend(engine: rlgen.Engine) -> None:
    chats = [[{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": f"What is {a} * {b}?"}]
             for a, b in PAIRS]
    answers = [str(a * b) for a, b in PAIRS]
    res = engine.episodes(chats, env=tool_env(), data={"answer": answers}, **SAMPLING)  # type: ignore[arg-type]
    records = res.records
    assert len(records) == 4 and all(r.status in ("done", "max_turns", "bad_tool_call") for r in records), records
    called = [r for r in records if any(t.get("calls") for t in r.turns if t["role"] == "env")]
    assert called, "the model never called the calculator"
    for r in called:  # the server's parser read the call, verifiers ran it, its answer was sent
        calls = [c for t in r.turns if t["role"] == "env" for c in t["calls"]]
        assert any(c["status"] == "answered" and c["name"] == "calculate" for c in calls), r.turns
    for i, r in enumerate(records):
        state = r.env
        assert res.df["reward_ToolEnv"][i] == state["reward"] == res.df["reward"][i]
        assert res.df["reward_ToolEnv_total_tool_calls"][i] == state["metrics"]["total_tool_calls"]
        # verifiers' trajectory: each step's prompt is the record's ids up to that turn, its
        # completion the sampled ids after it
        for step in state["trajectory"]:
            p, c = step["tokens"]["prompt_ids"], step["tokens"]["completion_ids"]
            assert r.ids[:len(p) + len(c)] == p + c
    checked = res.check_drift()
    assert set(checked.df["drift"]) <= {"same", "boundary", "retokenized"}, checked.df["drift"]
    for i in range(len(records)):
        d = checked.drift(i)
        assert d.same or d.role == "assistant", d
    assert engine.last_episodes is res


@pytest.mark.timeout(300)
def test_a_custom_multi_turn_env_raising_ends_only_its_episodes(engine: rlgen.Engine) -> None:
    res = engine.episodes(["Name a colour.", "Name a fruit."], env=faulty(max_turns=2), data={"answer": ["ok", "boom"]},
                          **{**SAMPLING, "max_new_tokens": 8, "stop": []})  # type: ignore[arg-type]
    statuses = [(r.prompt_index, r.status) for r in res.records]
    assert statuses == [(0, "max_turns"), (0, "max_turns"), (1, "env_error"), (1, "env_error")]
    for r in res.records[2:]:
        assert r.error == "RuntimeError: the environment broke" and "Traceback" in (r.traceback or "")
        assert len(r.assistant_turns) == 1
    for r in res.records[:2]:
        assert len(r.assistant_turns) == 2 and r.turns[1]["text"] == "Go on."
        assert r.turns[2]["cached_tokens"] > 0  # the second request reused the first one's prefix
    assert res.df["reward_Faulty"].tolist()[:2] == [1.0, 1.0]
    assert res.df["reward_Faulty_status"].tolist()[2:] == ["none", "none"]
    assert set(res.check_drift().df["drift"]) <= {"same", "boundary", "retokenized"}
