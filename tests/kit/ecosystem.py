"""What PEFT and TRL users train, built offline: a word-level fast tokenizer with a chat template
(saved with `save_pretrained`, loaded back with `AutoTokenizer`), tiny Llama models from configs (a
causal LM and a one-label sequence classifier, as TRL's reward models are), and the small datasets
TRL's trainers take (prompt-completion, preference pairs, prompts).

Plain functions, usable from job scripts in a process of their own (tests/jobs/trl_job.py).
"""

from __future__ import annotations

import os
import random
import time

import torch

WORDS = ["<pad>", "<unk>", "<s>", "</s>", "what", "is", "plus", "?", "user", "assistant", "the", "answer"]
WORDS += [str(i) for i in range(20)]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)


def save_once(folder: str, save, timeout: float = 120) -> None:
    """`save(path)` into a folder of its own, then renamed to `folder`: a reader never sees it half
    written. Under torchrun rank 0 writes it and the other ranks wait for it (transformers' own
    `save_pretrained` writes nothing on them once the process group is up)."""
    if os.path.isdir(folder) and os.listdir(folder):
        return
    if int(os.environ.get("RANK", "0")) > 0:
        deadline = time.monotonic() + timeout
        while not os.path.isdir(folder):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not write {folder} in {timeout} s")
            time.sleep(0.05)
        return
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    staging = f"{folder}.{os.getpid()}.tmp"
    save(staging)
    os.rename(staging, folder)


def tokenizer(folder: str):
    """The word-level tokenizer, saved into `folder` the first time and loaded from it."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
        )
        fast.chat_template = CHAT_TEMPLATE
        save_once(folder, fast.save_pretrained)
    return AutoTokenizer.from_pretrained(folder)


# The decoder shape of the tiny Llama, also that of the other decoder families the tests build.
DECODER = {
    "num_hidden_layers": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def llama_config(vocab_size: int, **kw):
    """A Llama config of the DECODER shape; `kw` any field."""
    from transformers import LlamaConfig

    return LlamaConfig(**{"vocab_size": vocab_size, **DECODER, **kw})


def llama_lm(seed: int | None = 0, **kw):
    """A LlamaForCausalLM of `llama_config(**kw)`, torch seeded with `seed` (None: not seeded)."""
    from transformers import LlamaForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(**kw))


def _fields(tok) -> dict:
    return {
        "vocab_size": len(tok),
        "max_position_embeddings": 64,
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def llama(tok, seed: int = 0):
    """A 2-layer Llama causal LM (about 20k parameters)."""
    return llama_lm(seed, **_fields(tok))


def llama_classifier(tok, seed: int = 0, num_labels: int = 1):
    """A 2-layer Llama sequence classifier (a reward model with one label)."""
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    return LlamaForSequenceClassification(llama_config(**_fields(tok), num_labels=num_labels))


def reward_len(completions, **kwargs):
    """A Python reward function (GRPO, RLOO): longer completions score higher."""
    return [len(c) / 10 for c in completions]


def _sums(n: int, seed: int) -> list[tuple[int, int]]:
    r = random.Random(seed)
    return [(r.randint(0, 9), r.randint(0, 9)) for _ in range(n)]


def completions(n: int = 32, seed: int = 0):
    """Prompt-completion rows ("what is 3 plus 4 ?" -> " 7")."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": f"what is {a} plus {b} ?", "completion": f" {min(a + b, 19)}"} for a, b in _sums(n, seed)]
    )


def preferences(n: int = 16, seed: int = 1):
    """Preference rows: a prompt, the right sum as chosen, a wrong one as rejected."""
    from datasets import Dataset

    rows = []
    for a, b in _sums(n, seed):
        good = min(a + b, 19)
        rows.append(
            {"prompt": f"what is {a} plus {b} ?", "chosen": f" {good}", "rejected": f" {(good + 3) % 20}"}
        )
    return Dataset.from_list(rows)


def prompts(n: int = 16, seed: int = 2):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": f"what is {a} plus {b} ?"} for a, b in _sums(n, seed)])


def lm_rows(tok, n: int = 32, length: int = 12, seed: int = 0) -> list[dict]:
    """Tokenized causal-LM rows of one length (input_ids = labels), no padding needed."""
    ids = torch.tensor([tok.convert_tokens_to_ids(str(i % 20)) for i in range(40)])
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 40 - length, (n,), generator=g)
    return [{"input_ids": ids[s : s + length], "labels": ids[s : s + length]} for s in starts.tolist()]
