"""verl's tools through `rlgen.envs.from_verl`: verl's own tool classes (0.9.1, pinned in
tests/data/verl-0.9.1-tools, see its README: verl cannot be installed next to rlgen's dev
environment) and tools written as verl's docs and tests write them, run unchanged.

The adapter's behaviour is checked on the episode environment directly (`env.new()`, `reset`, `step`
with an assistant message holding a `<tool_call>`): exact messages, rewards, statuses. Then on the
CPU backend through `Engine.episodes`, where SmolLM2-135M calls the tools when the system prompt
names them and one demo exchange shows a call (as notebooks/06_multi_turn.ipynb does).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import rlgen
from rlgen.envs import adapt, from_verl
from rlgen.episodes import Environment, EnvReply

VERL_DIR = Path(__file__).resolve().parents[1] / "data" / "verl-0.9.1-tools"
REPO = Path(__file__).resolve().parents[2]


def _import_pinned_verl() -> Any:
    """verl 0.9.1's `verl.tools` from the pinned copy: on sys.path for this module's imports only."""
    sys.path.insert(0, str(VERL_DIR))
    try:
        from verl.tools import base_tool, function_tool, schemas, tool_registry
    finally:
        sys.path.remove(str(VERL_DIR))
    return base_tool, function_tool, schemas, tool_registry


base_tool, function_tool, schemas, tool_registry = _import_pinned_verl()
BaseTool, OpenAIFunctionToolSchema, ToolResponse = base_tool.BaseTool, schemas.OpenAIFunctionToolSchema, \
    schemas.ToolResponse
assert Path(base_tool.__file__).is_relative_to(VERL_DIR)  # the pinned copy, not an installed verl


# ---- tools as verl's docs and tests write them -------------------------------------------------------------

@function_tool.function_tool
def get_weather(city: str) -> dict:
    """Get the current weather for a city.

    Args:
        city: The city to look up, e.g. "Tokyo" or "San Francisco".
    """
    return {"temperature_c": 17.3, "condition": "drizzle"}


@function_tool.function_tool
def score_guess(guess: int) -> tuple:
    """Score a guess of a secret number.

    Args:
        guess: The number guessed.
    """
    return ToolResponse(text=f"guess {guess}"), 0.25 * guess, {"guessed": guess}


GSM8K_SCHEMA = {"type": "function", "function": {
    "name": "calc_gsm8k_reward", "description": "A tool for calculating the reward of gsm8k",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string",
                                                               "description": "The answer to the question"}},
                   "required": ["answer"]}}}


class AnswerTool(BaseTool):
    """A BaseTool in the form of verl's Gsm8kTool: state per instance id, the ground truth from
    create_kwargs, a step reward from execute (and a penalty for an answer no better than before)."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self._instance_dict: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, ...]] = []

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        instance_id, response = await super().create(instance_id)
        ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        self.log.append(("create", instance_id, str(ground_truth)))
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, float, dict]:
        answer = str(parameters.get("answer", ""))
        state = self._instance_dict[instance_id]
        reward = 1.0 if answer.strip() == state["ground_truth"] else 0.0
        tool_reward = 0.0 if reward > state["reward"] else -0.05
        state["reward"] = reward
        agent_data = kwargs["agent_data"]
        self.log.append(("execute", instance_id, answer, agent_data.request_id, str(len(agent_data.messages))))
        agent_data.extra_fields.setdefault("answers", []).append(answer)
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), tool_reward, {"reward": reward}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.log.append(("release", instance_id))
        del self._instance_dict[instance_id]


def answer_tool() -> AnswerTool:
    return AnswerTool({"type": "native"}, OpenAIFunctionToolSchema.model_validate(GSM8K_SCHEMA))


class Faulty(BaseTool):
    """Raises in the step its config names."""

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        if self.config["fail"] == "create":
            raise RuntimeError("no sandbox left")
        return await super().create(instance_id)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, float, dict]:
        if self.config["fail"] == "execute":
            raise ValueError(f"cannot check {parameters.get('answer')!r}")  # the line the traceback names
        return ToolResponse(text="checked"), 0.5, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.released = instance_id
        if self.config["fail"] == "release":
            raise OSError("sandbox gone")


def faulty(fail: str) -> Faulty:
    return Faulty({"type": "native", "fail": fail}, OpenAIFunctionToolSchema.model_validate(GSM8K_SCHEMA))


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


ROW = {"data_source": "openai/gsm8k", "reward_model": {"style": "rule", "ground_truth": "72"},
       "extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}}}
PROMPT = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in all?"}]


def step(env: Environment, text: str, *, data: Any = ROW) -> tuple[Any, EnvReply]:
    """One episode of `env`: reset with `data`, then one step on an assistant turn saying `text`."""
    async def run() -> tuple[Any, EnvReply]:
        ep = await env.new()
        assert not isinstance(ep, EnvReply), ep
        assert (await ep.reset(data, prompt=PROMPT)).status is None
        return ep, await ep.step([*PROMPT, {"role": "assistant", "content": text}])

    return asyncio.run(run())


# ---- the adapter, without a server ----------------------------------------------------------------------


def test_a_function_tool_gets_the_json_arguments_and_answers_with_verls_tool_message() -> None:
    env = from_verl([get_weather])
    _, reply = step(env, "Let me look. " + call("get_weather", city="Tokyo"))
    assert reply.status is None and not reply.done
    assert reply.messages == [{"role": "tool", "content": '{"temperature_c": 17.3, "condition": "drizzle"}'}]
    assert reply.calls == [{"name": "get_weather", "arguments": {"city": "Tokyo"}, "status": "ok", "error": None,
                            "result": '{"temperature_c": 17.3, "condition": "drizzle"}'}]
    assert reply.reward == 0.0 and reply.info == {"tool_metrics": [{}]}  # verl's normalize: a dict gives 0.0, {}


def test_a_function_tools_tuple_gives_the_step_reward_and_metrics() -> None:
    _, reply = step(from_verl([score_guess]), call("score_guess", guess=2) + call("score_guess", guess=4))
    assert [m["content"] for m in reply.messages] == ["guess 2", "guess 4"]
    assert reply.reward == pytest.approx(1.5) and reply.info["tool_metrics"] == [{"guessed": 2}, {"guessed": 4}]


def test_a_base_tool_is_created_with_the_rows_create_kwargs_executed_and_released_per_call() -> None:
    tool = answer_tool()
    ep, reply = step(from_verl([tool]), call("calc_gsm8k_reward", answer="72"))
    assert reply.messages == [{"role": "tool", "content": "Current parsed answer='72' reward=1.0"}]
    assert reply.reward == 0.0 and reply.info == {"tool_metrics": [{"reward": 1.0}]}
    (c, iid, truth), (e, iid2, answer, request_id, n_messages), (r, iid3) = tool.log
    assert (c, e, r) == ("create", "execute", "release") and iid == iid2 == iid3 and truth == "72"
    assert answer == "72" and request_id == ep.obj.request_id and n_messages == "2"  # agent_data.messages: the chat so far
    assert tool._instance_dict == {}  # released
    assert ep.obj.extra_fields == {"answers": ["72"]} and ep.obj.tool_rewards == [0.0]
    # a wrong answer: reward 0, the penalty for no improvement (a fresh instance per call, as in verl)
    _, wrong = step(from_verl([tool]), call("calc_gsm8k_reward", answer="70"))
    assert wrong.reward == -0.05 and wrong.messages[0]["content"] == "Current parsed answer='70' reward=0.0"
    # verl's dataset moves extra_info.tools_kwargs to the row's top level: both are read
    tool.log.clear()
    step(from_verl([tool]), call("calc_gsm8k_reward", answer="1"),
         data={"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1"}}}})
    assert tool.log[0][2] == "1"


def test_the_schemas_are_verls_own_dicts_passed_through() -> None:
    tool = answer_tool()
    env = from_verl([tool, get_weather])
    expected = [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True),
                function_tool.get_function_tool("get_weather").tool_schema.model_dump(exclude_unset=True,
                                                                                     exclude_none=True)]
    assert env.tools == expected
    assert env.tools[0] == GSM8K_SCHEMA and "return" not in env.tools[1]["function"]  # as verl's loop hands them over
    assert env.kind == "framework" and set(env.reward_funcs or {}) == {"verl_tools"}


def test_tool_selection_narrows_the_episodes_tools_and_schemas() -> None:
    row = {**ROW, "extra_info": {**ROW["extra_info"], "tool_selection": ["get_weather", "not_a_tool"]}}
    ep, reply = step(from_verl([answer_tool(), get_weather]), call("calc_gsm8k_reward", answer="72"), data=row)
    assert [s["function"]["name"] for s in ep.tool_schemas] == ["get_weather"]
    assert reply.status == "bad_tool_call" and reply.calls[0]["error"] == "unknown tool"


def test_an_exception_in_execute_ends_the_episode_with_tool_error_naming_the_tools_line_and_release_runs() -> None:
    tool = faulty("execute")
    _, reply = step(from_verl([tool]), call("calc_gsm8k_reward", answer="72"))
    assert reply.status == "tool_error" and reply.messages == []
    assert reply.error == "tool 'calc_gsm8k_reward': ValueError: cannot check '72' (in Faulty.execute)"
    line = inspect.getsourcelines(Faulty.execute)[1] + 2
    assert f'test_verl.py", line {line}, in execute' in (reply.traceback or "")
    assert tool.released  # release ran after the failed execute, as verl's finally does


@pytest.mark.parametrize(("fail", "said"), [("create", "RuntimeError: no sandbox left (in Faulty.create)"),
                                            ("release", "OSError: sandbox gone (in Faulty.release)")])
def test_an_exception_in_create_or_release_is_a_tool_error_naming_the_step(fail: str, said: str) -> None:
    _, reply = step(from_verl([faulty(fail)]), call("calc_gsm8k_reward", answer="72"))
    assert reply.status == "tool_error" and reply.error == f"tool 'calc_gsm8k_reward': {said}"
    assert reply.traceback and "Traceback" in reply.traceback


def test_on_tool_error_reply_sends_verls_wording_back_and_goes_on() -> None:
    env = from_verl([faulty("execute"), get_weather], on_tool_error="reply")
    _, reply = step(env, call("calc_gsm8k_reward", answer="72") + call("get_weather", city="Oslo"))
    assert reply.status is None
    assert reply.messages == [{"role": "tool", "content": "Error executing tool 'calc_gsm8k_reward': cannot check '72'"},
                              {"role": "tool", "content": '{"temperature_c": 17.3, "condition": "drizzle"}'}]
    assert reply.reward == 0.0 and reply.tool_calls_failed == 1
    _, alone = step(env, call("calc_gsm8k_reward", answer="72"))
    assert alone.reward == 0.0 and alone.status is None  # verl's tool_rewards get 0.0 for a failed call


def test_on_tool_error_reply_keeps_the_failing_calls_traceback_in_its_call_record() -> None:
    env = from_verl([faulty("execute"), get_weather], on_tool_error="reply")
    _, reply = step(env, call("calc_gsm8k_reward", answer="72") + call("get_weather", city="Oslo"))
    failed, ok = reply.calls
    assert reply.status is None and "traceback" not in ok
    assert "raise ValueError(f\"cannot check" in failed["traceback"] and "in execute" in failed["traceback"]


def test_a_tool_call_inside_think_is_not_executed() -> None:
    tool = answer_tool()
    _, reply = step(from_verl([tool]), "<think>maybe " + call("calc_gsm8k_reward", answer="72") + "</think>It is 72.")
    assert reply.done and reply.status is None and reply.messages == [] and tool.log == []
    assert reply.info == {"calls_in_think": 1}


def test_a_malformed_call_is_kept_as_data() -> None:
    tool = answer_tool()
    _, reply = step(from_verl([tool]), '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": 72</tool_call>')
    assert reply.status == "bad_tool_call" and tool.log == []
    assert reply.calls[0]["name"] is None and reply.calls[0]["parser"] == "hermes"
    assert "bad JSON" in reply.calls[0]["error"]


@pytest.mark.parametrize(("side", "text"), [("left", "(truncated)...cdef"), ("right", "abcd...(truncated)"),
                                            ("middle", "ab...(truncated)...ef")])
def test_max_tool_response_length_cuts_as_verl_cuts(side: str, text: str) -> None:
    @function_tool.function_tool(f"letters_{side}")
    def letters() -> str:
        """Six letters."""
        return "abcdef"

    env = from_verl([letters], max_tool_response_length=4, tool_response_truncate_side=side)
    _, reply = step(env, call(f"letters_{side}"))
    assert reply.messages == [{"role": "tool", "content": text}]


def test_max_parallel_calls_runs_only_the_first_calls() -> None:
    _, reply = step(from_verl([score_guess], max_parallel_calls=1), call("score_guess", guess=1) +
                    call("score_guess", guess=2))
    assert [m["content"] for m in reply.messages] == ["guess 1"] and reply.tool_calls == 1


def test_a_multimodal_tool_response_is_not_serialisable() -> None:
    @function_tool.function_tool
    def snapshot() -> Any:
        """A picture."""
        return ToolResponse(text="look", image=["<an image>"])

    _, reply = step(from_verl([snapshot]), call("snapshot"))
    assert reply.status == "not_serialisable" and "text only" in (reply.error or "")


def test_tools_load_with_verls_own_load_all_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_verl_tools.py").write_text(textwrap.dedent('''
        from verl.tools.base_tool import BaseTool
        from verl.tools.schemas import ToolResponse

        class Echo(BaseTool):
            async def execute(self, instance_id, parameters, **kwargs):
                return ToolResponse(text="echo " + parameters["text"]), 1.0, {}
    '''))
    (tmp_path / "functions.py").write_text(textwrap.dedent('''
        from verl.tools.function_tool import function_tool

        @function_tool
        def shout(text: str) -> str:
            """Shout it.

            Args:
                text: What to shout.
            """
            return text.upper()
    '''))
    config = tmp_path / "tool_config.yaml"
    config.write_text(textwrap.dedent('''
        tools:
          - class_name: my_verl_tools.Echo
            config: {type: native}
            tool_schema: {type: function, function: {name: echo, description: Echo the text.,
              parameters: {type: object, properties: {text: {type: string, description: the text}}, required: [text]}}}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(VERL_DIR))  # verl importable by name, for load_all_tools
    env = from_verl(tool_config_path=str(config), function_tool_path=str(tmp_path / "functions.py"))
    assert [s["function"]["name"] for s in env.tools or []] == ["echo", "shout"]
    _, reply = step(env, call("echo", text="hi") + call("shout", text="hi"))
    assert [m["content"] for m in reply.messages] == ["echo hi", "HI"] and reply.reward == 1.0


def test_options_and_tools_are_checked_before_anything_runs() -> None:
    def plain(x: int) -> int:
        """Not a verl tool.

        Args:
            x: a number.
        """
        return x

    with pytest.raises(TypeError, match=r"rlgen\.episodes\.tool_env"):
        from_verl([plain])
    with pytest.raises(ValueError, match="has no tools"):
        from_verl([])
    with pytest.raises(ValueError, match="on_tool_error"):
        from_verl([get_weather], on_tool_error="ignore")
    with pytest.raises(ValueError, match="truncate_side"):
        from_verl([get_weather], tool_response_truncate_side="top")
    with pytest.raises(ValueError, match="max_tool_response_length"):
        from_verl([get_weather], max_tool_response_length=0)
    with pytest.raises(ValueError, match="two tools are named"):
        from_verl([answer_tool(), answer_tool()])


def test_compute_score_is_called_as_verls_reward_manager_calls_it() -> None:
    seen: list[dict[str, Any]] = []

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
        seen.append({"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
                     "extra_info": extra_info})
        return 1.0

    funcs = from_verl([get_weather], compute_score=compute_score).reward_funcs or {}
    assert list(funcs) == ["verl_tools", "compute_score"]
    assert funcs["compute_score"]({**ROW, "completion": "It is 72."}) == 1.0
    assert seen == [{"data_source": "openai/gsm8k", "solution_str": "It is 72.", "ground_truth": "72",
                     "extra_info": ROW["extra_info"]}]
    assert funcs["verl_tools"]({"step_rewards": [0.0, -0.05, 1.0]}) == pytest.approx(0.95)
    assert funcs["verl_tools"]({"step_rewards": []}) is None


def test_adapt_recognises_verl_tools_and_leaves_plain_functions_alone() -> None:
    adapted = adapt([answer_tool(), get_weather])
    assert isinstance(adapted, Environment) and [s["function"]["name"] for s in adapted.tools or []] == \
        ["calc_gsm8k_reward", "get_weather"]
    assert isinstance(adapt(answer_tool()), Environment)

    def plain(x: int) -> int:
        return x

    assert adapt([plain]) == [plain] and adapt([get_weather, plain]) == [get_weather, plain]


def test_adapt_recognises_verl_tools_without_importing_verl() -> None:
    script = textwrap.dedent('''
        import sys, types
        import rlgen.envs
        # a BaseTool subclass as verl's own module names it, made here: no verl on the path
        Base = type("BaseTool", (), {"__module__": "verl.tools.base_tool"})
        class Mine(Base):
            name = "mine"
            tool_schema = {"type": "function", "function": {"name": "mine", "description": "d"}}
        env = rlgen.envs.adapt([Mine()])
        print(type(env).__name__, env.tools[0]["function"]["name"], any(m.startswith("verl") for m in sys.modules))
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                             str(REPO), os.environ.get("PYTHONPATH")]))}, timeout=120, check=True)
    assert out.stdout.split() == ["Environment", "mine", "False"]


# ---- on the CPU backend, through Engine.episodes --------------------------------------------------------

SYSTEM = ('You are a helpful assistant with an answer checker. To check an answer, write <tool_call>{"name": '
          '"calc_gsm8k_reward", "arguments": {"answer": "..."}}</tool_call> and wait for the result. Then give '
          'the final answer.')
DEMO = [
    {"role": "user", "content": "What is 17 + 25?"},
    {"role": "assistant", "content": call("calc_gsm8k_reward", answer="42")},
    {"role": "tool", "content": "Current parsed answer='42' reward=1.0"},
    {"role": "assistant", "content": "The answer is 42."},
]
SUMS = [(12, 30), (45, 27), (8, 16), (33, 41)]
SAMPLING = dict(n=2, max_turns=3, max_new_tokens=40, temperature=0.7, stop=["</tool_call>"], sampling_seed=0,
                progress=False)
VALID = {"done", "max_turns", "context_limit", "bad_tool_call", "tool_error", "tool_timeout", "bad_arguments",
         "not_serialisable"}


@pytest.fixture(scope="module")
def engine(model_path: str):
    eng = rlgen.Engine(model_path, backend=os.environ.get("RLGEN_TEST_BACKEND", "cpu"), progress=False)
    yield eng
    eng.close()


def chats_and_rows() -> tuple[list[Any], list[dict[str, Any]]]:
    chats = [[{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": f"What is {a} + {b}?"}]
             for a, b in SUMS]
    rows = [{"data_source": "sums", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"index": i, "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs":
                                                                               {"ground_truth": str(a + b)}}}}}
            for i, (a, b) in enumerate(SUMS)]
    return chats, rows


@pytest.mark.timeout(300)
def test_verl_tools_and_compute_score_run_through_engine_episodes(engine: rlgen.Engine) -> None:
    tool = answer_tool()

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
        return float(ground_truth in solution_str)

    chats, rows = chats_and_rows()
    env = from_verl([tool, get_weather], compute_score=compute_score)
    res = engine.episodes(chats, env=env, data=rows, **SAMPLING)
    records = res.records
    assert {r.status for r in records} <= VALID, [(r.status, r.error) for r in records]
    # the tool ran, each call created with its own row's ground truth and released
    truths = {e[1]: e[2] for e in tool.log if e[0] == "create"}
    executed = [e for e in tool.log if e[0] == "execute"]
    assert executed, [r.turns for r in records]
    by_request = {r.env.request_id: r for r in records}
    for _, iid, _answer, request_id, _ in executed:
        assert truths[iid] == by_request[request_id].data["reward_model"]["ground_truth"]
    assert tool._instance_dict == {}  # every instance released
    # step rewards: the env turns' reward column, summed in the verl_tools reward column
    turns = res.turns
    env_turns = turns[turns.role == "env"]
    for i, r in enumerate(records):
        steps = [t["reward"] for t in r.turns if t["role"] == "env" and t.get("reward") is not None]
        assert steps == list(env_turns[(env_turns.prompt_index == r.prompt_index) &
                                       (env_turns.sample_index == r.sample_index)].reward.dropna())
        assert steps == r.env.tool_rewards
        value = res.df["reward_verl_tools"].iloc[i]
        assert (value == pytest.approx(sum(steps))) if steps else value != value  # NaN: no step reward
        assert res.df["reward_compute_score"].iloc[i] == float(r.data["reward_model"]["ground_truth"] in
                                                               (res.df["completion"].iloc[i] or ""))
    assert env_turns.reward.notna().any()
    _token_faithful(engine, res, env)


def _token_faithful(engine: rlgen.Engine, res: Any, env: Environment) -> None:
    """Each record's ids: the first prompt as the template renders it with verl's schemas, then the
    sampled ids (loss mask 1) and the environment's deltas; the tool's answer is in a delta."""
    from rlgen.episodes._template import first_prompt_ids

    tok = engine.tokenizer
    for r in res.records:
        prompt = r.messages[:r.n_prompt_messages]
        assert r.ids[:r.prompt_len] == first_prompt_ids(tok, prompt, tools=env.tools)
        assert sum(r.loss_mask) == sum(t["tokens"] for t in r.turns if t["role"] == "assistant")
        answered = [t for t in r.turns if t["role"] == "env" and t.get("tool_calls") and t["tokens"]]  # sent
        if answered and r.status != "tool_error":
            env_ids = [i for i, role in zip(r.ids, r.roles) if role == "env"]
            assert "Current parsed answer=" in tok.decode(env_ids) or "17.3" in tok.decode(env_ids)
    checked = res.check_drift()  # a trainer's re-render of the messages gives the same ids
    assert set(checked.df.drift) == {"same"}, checked.df.drift.tolist()


@pytest.mark.timeout(300)
def test_a_list_of_verl_tools_is_taken_as_it_is_and_a_raising_tool_ends_only_its_episode(
        engine: rlgen.Engine) -> None:
    tool = faulty("execute")
    chats, rows = chats_and_rows()
    res = engine.episodes(chats, env=[tool], data=rows, **SAMPLING)  # adapt(): from_verl with its defaults
    records = res.records
    assert {r.status for r in records} <= VALID, [(r.status, r.error) for r in records]
    failed = [r for r in records if r.status == "tool_error"]
    assert failed, [r.turns for r in records]
    line = inspect.getsourcelines(Faulty.execute)[1] + 2
    for r in failed:
        assert "ValueError: cannot check" in (r.error or "") and "(in Faulty.execute)" in (r.error or "")
        assert f'test_verl.py", line {line}, in execute' in (r.traceback or "")
    others = [r for r in records if r.status != "tool_error"]
    # no call of the raising tool worked (the others ended before one, or on a malformed call)
    assert all(c.get("status") != "ok" for r in others for t in r.turns if t["role"] == "env"
               for c in t.get("calls") or []), [r.turns for r in others]
    assert "reward_verl_tools" in res.df.columns
