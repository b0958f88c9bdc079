"""A small GPT-2-architecture causal LM and a byte-level text dataset, with no dependency beyond
torch: what `trainwright demo` trains, and what tests and benchmarks use when transformers is absent.

The model follows the trainwright loss contract (see loss.py): it shifts its labels itself
(`label_shift = True`) and takes `num_items_in_batch`, returning sum of token losses / that count.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


@dataclass
class TinyGPTConfig:
    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1

    def __post_init__(self) -> None:
        # here, not as torch's bare AssertionError deep inside nn.MultiheadAttention
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyGPTConfig: {name}={value!r} is invalid: an integer >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"TinyGPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head} (each head "
                f"takes n_embd / n_head dimensions): make n_embd a multiple of n_head"
            )

    def to_dict(self) -> dict:
        return asdict(self)


class _Block(nn.Module):
    def __init__(self, cfg: TinyGPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, dropout=cfg.dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=causal_mask, need_weights=False, is_causal=True)[0]
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer with tied input/output embeddings (like GPT-2)."""

    label_shift = True
    accepts_loss_kwargs = True

    def __init__(self, config: TinyGPTConfig | None = None):
        super().__init__()
        self.config = config or TinyGPTConfig()
        cfg = self.config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> dict[str, torch.Tensor]:
        t = input_ids.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"input_ids has length {t}, longer than block_size={self.config.block_size}.")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        mask = torch.triu(torch.full((t, t), float("-inf"), device=input_ids.device), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lm_head(self.ln_f(x))
        out = {"logits": logits}
        if labels is not None:
            target = labels[:, 1:].reshape(-1)
            pred = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
            if num_items_in_batch is None:
                out["loss"] = F.cross_entropy(pred, target, ignore_index=-100)
            else:
                out["loss"] = (
                    F.cross_entropy(pred, target, ignore_index=-100, reduction="sum") / num_items_in_batch
                )
        return out

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        skip = {id(self.wte.weight), id(self.wpe.weight)} if exclude_embeddings else set()
        return sum(p.numel() for p in self.parameters() if id(p) not in skip)

    @torch.no_grad()
    def generate(
        self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.8, top_k: int = 20
    ):
        """Sample continuations (used by the demo to show what the model learned)."""
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            context = input_ids[:, -self.config.block_size :]
            logits = self(context)["logits"][:, -1, :] / temperature
            kth = torch.topk(logits, top_k).values[:, -1, None]
            logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1)
            input_ids = torch.cat([input_ids, nxt], dim=1)
        self.train(was_training)
        return input_ids


class ByteTextDataset(Dataset):
    """Fixed-length windows of a text's UTF-8 bytes; item = {"input_ids", "labels"} (labels are the
    same ids: the model shifts them)."""

    def __init__(self, text: str, block_size: int, stride: int | None = None):
        data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
        if len(data) < block_size:
            raise ValueError(f"The text has {len(data)} bytes, fewer than block_size={block_size}.")
        self.data = data
        self.block_size = block_size
        self.stride = stride or block_size
        self.count = (len(data) - block_size) // self.stride + 1

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.count:
            raise IndexError(i)
        chunk = self.data[i * self.stride : i * self.stride + self.block_size]
        return {"input_ids": chunk, "labels": chunk}


def decode_bytes(ids: torch.Tensor) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 50 else float("inf")
