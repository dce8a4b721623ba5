"""On the GPU machine: a small chat Rollouts from SGLang (5 prompts x 4, top-3, a reward) saved as
$OUT/sglang-rollouts.parquet, to open in the rollout browser where there is a browser (JupyterLab)."""

import os

import rlgen

QUESTIONS = ["Écris une phrase en français sur le café.", "List three colours, one per line.", "What is 2+2?",
             "Write a haiku about the sea.", "Give me a Python one-liner that reverses a string."]
chats = [[{"role": "system", "content": "You are a helpful assistant. Answer briefly."}, {"role": "user", "content": q}]
         for q in QUESTIONS]
with rlgen.Engine(os.environ["RLGEN_TEST_MODEL"], progress=True) as eng:
    res = eng.generate(chats, n=4, max_new_tokens=64, temperature=0.8, top_logprobs=3)
    res = res.add_rewards({"short": lambda completion: float(len(completion) < 120)})
    res.to_parquet(os.path.join(os.environ["OUT"], "sglang-rollouts.parquet"))
    print(res)
