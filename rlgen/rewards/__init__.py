"""The reward layer: scoring rows with reward functions, group statistics, and built-in rewards and tasks.

Owns: running the user's reward functions over rows in their own style (`_scoring`, `_styles`),
safely in worker processes, threads or inline (`_exec*`), per prompt group statistics and
advantages (`rewards._group_stats`), the reward summary and its flags (`_summary`), and this package's
public built-ins below. Knows nothing about servers or the result object: it takes rows as a
`RowBatch` and group keys, and returns columns (`rlgen.rollouts` adds them to a `Rollouts`).

Built-in rewards and offline tasks: answer checks, format and length rewards, reasoning-gym tasks.

Every reward here is a plain per-row function whose parameter names are rollout columns or
per-prompt data (`completion`, `answer`, `completion_tokens`, `metadata`), returning a float, or
None where it cannot judge (e.g. no answer found). Configurable ones are factories whose result
is named for its settings (`answer_match(extract="last_number")` is `answer_last_number`). All
pickle with cloudpickle, for worker processes.

Importing this package stays light: math-verify and reasoning-gym (the optional extra
`pip install 'rlgen[rewards]'`) are imported by the functions that need them, when called.

Usage::

    from rlgen import rewards
    task = rewards.tutorial_task()                         # 16 small additions
    res = eng.generate(task.prompts, **task.sampling)      # n=8 samples each
    rewards.extract_answer("so 3 + 4 = 7", "last_number")  # '7'
    rewards.sanity_check(my_reward, task.data)             # oracle > empty and garbage, deterministic
"""

from __future__ import annotations

from ._answers import (
    COMPARE_METHODS,
    EXTRACT_METHODS,
    CompareMethod,
    ExtractMethod,
    answer_match,
    answers_match,
    extract_answer,
    parse_number,
)
from ._extra import INSTALL_HINT
from ._math import math_verify_match, math_verify_reward
from ._sanity import GARBAGE, SanityReport, sanity_check
from ._shape import soft_overlong_penalty, think_format
from ._tasks import DEFAULT_INSTRUCTION, PROMPT_STYLES, PromptStyle, Task, reasoning_gym_task, tutorial_task

__all__ = [
    "COMPARE_METHODS",
    "DEFAULT_INSTRUCTION",
    "EXTRACT_METHODS",
    "GARBAGE",
    "INSTALL_HINT",
    "PROMPT_STYLES",
    "CompareMethod",
    "ExtractMethod",
    "PromptStyle",
    "SanityReport",
    "Task",
    "answer_match",
    "answers_match",
    "extract_answer",
    "math_verify_match",
    "math_verify_reward",
    "parse_number",
    "reasoning_gym_task",
    "sanity_check",
    "soft_overlong_penalty",
    "think_format",
    "tutorial_task",
]
