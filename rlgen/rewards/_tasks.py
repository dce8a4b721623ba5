"""Offline tasks: procedural question sets from reasoning-gym, as prompts, per-prompt data and rewards.

Owns: `Task` (prompts ready for `Engine.generate`, a DataFrame of per-prompt data, and the rewards
that fit them), `reasoning_gym_task` (any reasoning-gym dataset by name), the prompt styles, and
`tutorial_task`, the measured preset that the default model scores partly right on (numbers in
docs/rewards-tasks.md). reasoning-gym (optional extra `rlgen[rewards]`) and pandas are imported
when a task is built or scored, never at import. Nothing is downloaded: reasoning-gym generates
every question from its seed. Knows nothing about generation or how rewards are called.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from ._answers import answer_match
from ._extra import require

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DEFAULT_INSTRUCTION", "PROMPT_STYLES", "PromptStyle", "Task", "reasoning_gym_task", "tutorial_task"]

PromptStyle = Literal["user", "system", "default"]
PROMPT_STYLES: tuple[str, ...] = get_args(PromptStyle)
DEFAULT_INSTRUCTION = "Answer with just the number."

Message = dict[str, str]
TaskReward = Callable[[str, Any, Any], float]


@dataclass(frozen=True, eq=False)
class Task:
    """A set of questions with their gold answers and rewards, ready to generate and score.

    Attributes:
        name: the reasoning-gym dataset name, e.g. "basic_arithmetic".
        prompts: one chat per question (`[{"role": ..., "content": ...}, ...]`), in `data`'s row order;
            pass them to `eng.generate(task.prompts, ...)`, so row i of `data` is `prompt_index` i.
        data: a DataFrame with a row per prompt: `question`, `answer` (str; None where the dataset
            has no single gold answer), `task` (the name), `metadata` (the entry's metadata as a
            JSON string, so the frame round-trips through parquet). Pass it as the rewards'
            per-prompt data.
        reward: the dataset's own scorer (`score_answer`) as a reward `f(completion, answer, metadata)`,
            named `rg_<name>`. It reads the answer from `<answer>...</answer>` tags (reasoning-gym's
            format) and gives partial credit as the dataset defines it; see docs/rewards-tasks.md.
        extract_reward: `answer_match(extract="last_number")`: the last number in the completion
            against `answer`, None when the completion holds no number.
        sampling: generate() options the task was measured with (empty unless it is a preset).
        config: the reasoning-gym dataset config used (without seed and size).
        seed, size, prompt_style, instruction: how the task was built.
    """

    name: str
    prompts: list[list[Message]]
    data: pd.DataFrame
    reward: TaskReward
    extract_reward: Callable[[str, str], float | None]
    sampling: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    size: int = 0
    prompt_style: PromptStyle = "user"
    instruction: str = DEFAULT_INSTRUCTION

    def __len__(self) -> int:
        return len(self.prompts)

    def __repr__(self) -> str:
        config = "".join(f", {k}={v!r}" for k, v in self.config.items())
        return f"Task({self.name!r}, size={self.size}, seed={self.seed}, prompt_style={self.prompt_style!r}{config})"


def _reasoning_gym(needed_by: str) -> Any:
    return require("reasoning_gym", package="reasoning-gym", needed_by=needed_by)


@functools.lru_cache(maxsize=16)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    """The reasoning-gym dataset, built once per process (rewards call this once per row)."""
    rg = _reasoning_gym(f"the reasoning-gym task {name!r}")
    return rg.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


@functools.lru_cache(maxsize=4096)
def _entry(name: str, config_json: str, seed: int, size: int, index: int) -> dict[str, Any]:
    entry: dict[str, Any] = _dataset(name, config_json, seed, size)[index]
    return entry


def _metadata_dict(metadata: Any) -> dict[str, Any]:
    if isinstance(metadata, str):
        decoded = json.loads(metadata)
    elif isinstance(metadata, Mapping):
        decoded = dict(metadata)
    else:
        raise TypeError(f"metadata must be the task's JSON string or a dict, got {type(metadata).__name__}; "
                        "pass the task's `data` as the per-prompt data")
    if not isinstance(decoded, dict):
        raise TypeError(f"metadata must decode to a dict, got {type(decoded).__name__}")
    return decoded


def _missing(value: Any) -> bool:
    """None, NaN or pandas' NA: what a DataFrame cell holds where the dataset has no gold answer."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType"


def _task_reward(name: str, config_json: str, seed: int, size: int) -> TaskReward:
    def reward(completion: str, answer: Any, metadata: Any) -> float:
        rg = _reasoning_gym(f"the reward of the reasoning-gym task {name!r}")
        dataset = _dataset(name, config_json, seed, size)
        md = _metadata_dict(metadata)
        gold = None if _missing(answer) else str(answer)
        # JSON turns the metadata's tuples into lists, and some scorers compare with tuples
        # (arc_agi's boards): where the row names its entry, score against the entry itself,
        # regenerated from the seed, after checking it is the same question's entry.
        entry: dict[str, Any] = {"question": "", "answer": gold, "metadata": md}
        index = md.get("source_index")
        if md.get("source_dataset") == name and isinstance(index, int) and 0 <= index < size:
            regenerated = _entry(name, config_json, seed, size, index)
            if regenerated["answer"] == gold and regenerated["metadata"].get("source_index") == index:
                entry = copy.deepcopy(regenerated)  # the cached entry stays as generated, whatever a scorer does
        parsed = rg.utils.extract_answer(completion, tag_name="answer")
        return float(dataset.score_answer(parsed, entry))

    reward.__name__ = f"rg_{name}"
    reward.__doc__ = f"reasoning-gym's score_answer of {name!r} on the completion's <answer> tag (partial credit as the dataset defines it)."
    return reward


def _chat(question: str, style: str, instruction: str, system_prompt: str) -> list[Message]:
    if style == "user":
        return [{"role": "user", "content": f"{question} {instruction}".strip()}]
    if style == "system":
        return [{"role": "system", "content": instruction}, {"role": "user", "content": question}]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def reasoning_gym_task(name: str, *, size: int, seed: int = 0, prompt_style: PromptStyle = "user",
                       instruction: str = DEFAULT_INSTRUCTION, **config: Any) -> Task:
    """A reasoning-gym dataset as a `Task`: `size` questions generated from `seed`, nothing downloaded.

    Args:
        name: a reasoning-gym dataset name ("basic_arithmetic", "chain_sum", "leg_counting", ...).
        size: how many questions (prompts).
        seed: the dataset seed; the same (name, config, seed, size) gives the same questions.
        prompt_style: how each question becomes a chat:
            "user": the question with `instruction` appended, as the one user message (the model's
                chat template adds its own default system prompt, if it has one);
            "system": `instruction` as the system prompt, the question as the user message;
            "default": reasoning-gym's "default" system prompt (reason step by step, then give the
                answer in `<answer>` tags), the question as the user message.
        instruction: the sentence the "user" and "system" styles add. Its default asks for a bare
            number, which suits numeric tasks; change it for others.
        **config: the dataset's config fields (e.g. `min_terms=2, operators=("+",)` for
            basic_arithmetic); see reasoning-gym's `<Name>Config` classes.

    Raises:
        ImportError: reasoning-gym is not installed (pip install 'rlgen[rewards]').
        ValueError: an unknown dataset name or prompt style, a size < 1, or a config the dataset rejects.
    """
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"unknown prompt_style {prompt_style!r}; use one of {', '.join(map(repr, PROMPT_STYLES))}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    rg = _reasoning_gym(f"reasoning_gym_task({name!r})")
    import pandas as pd

    known = rg.factory.DATASETS
    if name not in known:
        import difflib

        guess = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        raise ValueError(f"reasoning-gym has no dataset {name!r}; {hint}see reasoning_gym.factory.DATASETS for the names")
    # The config travels with the reward (to worker processes) as JSON: tuples become lists, which
    # every reasoning-gym config accepts in their place.
    try:
        config_json = json.dumps(config, sort_keys=True)
    except TypeError as exc:
        raise ValueError(f"the config of {name!r} must be JSON-serialisable (numbers, strings, lists, dicts): {exc}") from None
    try:
        dataset = _dataset(name, config_json, seed, size)
    except (TypeError, AssertionError, ValueError) as exc:
        raise ValueError(f"reasoning-gym rejected the config {config!r} of {name!r}: {exc}") from exc
    entries = list(dataset)
    system_prompt: str = rg.utils.SYSTEM_PROMPTS["default"]
    prompts = [_chat(e["question"], prompt_style, instruction, system_prompt) for e in entries]
    data = pd.DataFrame({
        "question": [e["question"] for e in entries],
        "answer": [None if e["answer"] is None else str(e["answer"]) for e in entries],
        "task": name,
        "metadata": [json.dumps(e["metadata"], sort_keys=True, default=str) for e in entries],
    })
    return Task(
        name=name, prompts=prompts, data=data,
        reward=_task_reward(name, config_json, seed, size),
        extract_reward=answer_match(extract="last_number", compare="numeric"),
        config=json.loads(config_json), seed=seed, size=size, prompt_style=prompt_style, instruction=instruction,
    )


# The preset's settings, chosen by measuring the default model on candidates (docs/rewards-tasks.md).
# Without parentheses and negation, basic_arithmetic draws each term from 0..10.
TUTORIAL_CONFIG: dict[str, Any] = {
    "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
    "allow_parentheses": False, "allow_negation": False,
}
TUTORIAL_SAMPLING: dict[str, Any] = {"n": 8, "temperature": 0.7, "max_new_tokens": 32}


def tutorial_task(*, size: int = 16, seed: int = 0) -> Task:
    """The tutorial's task: small additions that the default model (SmolLM2-135M-Instruct) gets
    partly right, so that rewards vary within most groups of samples.

    basic_arithmetic with two terms from 0 to 10, "+" only, no parentheses or signs ("Calculate
    4 + 1."), prompt style "user" ("Answer with just the number."). Generate with
    `eng.generate(task.prompts, **task.sampling)` (n=8, temperature=0.7, max_new_tokens=32), the
    settings it was measured with (docs/rewards-tasks.md). Score with `task.extract_reward` (the
    last number): the dataset's own `task.reward` wants `<answer>` tags, which this model does not
    write, so it scores 0 here (itself a lesson in reward debugging).

    Raises:
        ImportError: reasoning-gym is not installed (pip install 'rlgen[rewards]').
    """
    task = reasoning_gym_task("basic_arithmetic", size=size, seed=seed, prompt_style="user", **TUTORIAL_CONFIG)
    return replace(task, sampling=dict(TUTORIAL_SAMPLING))
