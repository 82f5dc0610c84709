"""lrl_jax.tasks — verifiable-reward tasks: prompts, references and a reward function.

`ArithmeticTask` is the embedded default (synthetic arithmetic, `CharTokenizer`, vocab 20), small enough
for a tiny Qwen2-shaped model on 2 CPU cores. `GSM8KTask` reads a user's GSM8K-format JSONL file. `PromptsTask`
is the user's own: (prompt, reference) rows (a JSONL file, or any sequence) and a reward function.
`ChatPromptFormatter` wraps prompts in SmolLM2-Instruct's chat template over a `tokenizers.Tokenizer`.
`safe_reward` / `score_batch` score a failing or hanging reward function as 0, count it, and go on.

Every task: `prompts(step, B)` -> (prompt strings, references), reproducible by (seed, step);
`encode_prompts(prompts)` -> (tokens_BP int32, valid_BP bool), left-padded by default;
`supervised_batch(step, B)` -> prompt + answer tokens with a loss mask on the answer;
`decode_completions(tokens_BN)`; `reward(completion, reference)`; `score(completions, references)`.
"""

from lrl_jax.tasks.arithmetic import ARITHMETIC_OPS, ArithmeticTask
from lrl_jax.tasks.base import PromptEncoder, SupervisedBatch, Task, pad_sequences
from lrl_jax.tasks.chat import SMOLLM2_SYSTEM, ChatPromptFormatter, TextEncoder
from lrl_jax.tasks.factory import encoder_from_config, task_from_config
from lrl_jax.tasks.gsm8k import GSM8KTask, load_gsm8k
from lrl_jax.tasks.numbers import extract_completion_answer, extract_reference_answer, find_numbers, parse_number
from lrl_jax.tasks.pool import RewardPool
from lrl_jax.tasks.prompts import PromptsTask, exact_match, last_number_match, load_prompts, resolve_reward
from lrl_jax.tasks.reward import safe_reward, score_batch
from lrl_jax.tasks.tokenizer import ARITHMETIC_CHARS, CharTokenizer

__all__ = [
  "Task",
  "PromptEncoder",
  "SupervisedBatch",
  "pad_sequences",
  "ArithmeticTask",
  "ARITHMETIC_OPS",
  "CharTokenizer",
  "ARITHMETIC_CHARS",
  "GSM8KTask",
  "load_gsm8k",
  "extract_reference_answer",
  "extract_completion_answer",
  "find_numbers",
  "parse_number",
  "ChatPromptFormatter",
  "TextEncoder",
  "SMOLLM2_SYSTEM",
  "safe_reward",
  "score_batch",
  "RewardPool",
  "task_from_config",
  "encoder_from_config",
  "PromptsTask",
  "load_prompts",
  "resolve_reward",
  "exact_match",
  "last_number_match",
]
