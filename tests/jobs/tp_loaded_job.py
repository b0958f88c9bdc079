"""A model transformers sharded when loading it (`from_pretrained(tp_plan="auto")`), trained by
trainwright under torchrun (tests/distributed/test_tp_loaded.py), or the same model whole in one process.

    python tp_loaded_job.py CFG     |     torchrun --nproc_per_node=2 tp_loaded_job.py CFG

CFG (JSON): {"folder": dir, "report": file.json}. A tiny Llama is saved into `folder` (by the caller),
trained 4 steps (checkpoint every 2); under torchrun a fresh sharded copy then resumes checkpoint-2
in the same processes. Rank 0 reports the losses, the checkpoint's files, the final full weights and
whether the resume ended on them bit for bit.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared kit
import transformers  # noqa: E402
from kit import ecosystem as eco  # noqa: E402

from trainwright import Trainer, TrainingArguments  # noqa: E402


def train(cfg: dict, out: str, resume: str | None = None) -> Trainer:
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(cfg["folder"], "model"), **({"tp_plan": "auto"} if several else {})
    )
    args = TrainingArguments(
        output_dir=out,
        max_steps=4,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_steps=2,
        learning_rate=1e-3,
        seed=3,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    tok = eco.tokenizer(os.path.join(cfg["folder"], "tok"))
    trainer = Trainer(model=model, args=args, train_dataset=eco.lm_rows(tok))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def full_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
        for k, v in trainer.model.state_dict().items()
    }


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    out = os.path.join(cfg["folder"], "run" + os.environ.get("WORLD_SIZE", "1"))
    first = train(cfg, out)
    report = {
        "losses": [r["loss"] for r in first.state.log_history if "loss" in r and "train_loss" not in r],
        "files": sorted(os.listdir(os.path.join(out, "checkpoint-4"))),
        "tp_size": first.get_tp_size(),
    }
    weights = full_weights(first)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        again = train(cfg, out + "-resumed", resume=os.path.join(out, "checkpoint-2"))
        resumed = full_weights(again)
        report["resume_exact"] = all(torch.equal(weights[k], resumed[k]) for k in weights)
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(weights, cfg["report"] + ".weights.pt")
        with open(cfg["report"], "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
