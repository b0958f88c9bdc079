"""TRL's trainers on tiny offline models, as a TRL user writes them (only transformers and trl are
imported): run with `python trl_job.py CFG` they train on transformers, with
`python -m trainwright run trl_job.py CFG` on trainwright (tests/app/test_trl.py runs both).

CFG is JSON: {"scenarios": [...], "root": dir, "tokenizer": dir, "report": file.json, options}.
Scenarios: sft, sft_lora, sft_pack, sft_padding_free (TRL's own padding_free), dpo (a reference model), dpo_none (`ref_model=None`, the model
loaded from a folder), dpo_lora, reward, reward_metrics (with a `compute_metrics`), reward_bf16
(RewardConfig's default bf16, 20 steps), grpo (generation through `model.generate`, a Python reward),
grpo_rollout (a `rollout_func` whose extra field goes to the reward), grpo_entropy (the adaptive
entropy bonus, its controller's state in each checkpoint); and the other trainers built on the
Trainer: kto, rloo, distillation, orpo, cpo, gkd (training only).
Each trains 4 steps (a checkpoint every 2) and reports its log history, the files it wrote and the
base class its trainer has. Options: "resumed" (a second trainer per scenario resumes checkpoint-2 in
this process; its final weights are compared with the first's), "async" (a third run with async_save,
whose checkpoint files are compared byte for byte), "accumulation" (SFT: one step of a batch of 4
against two micro-batches of 2), "args" (arguments over the scenarios' own), "only_resume" (resume the newest checkpoint of `root/<scenario>`), "lifetime" (SFT and SFT with
LoRA: whether `del trainer` frees the model at once),
"announce" (print SAVED <step> at each save, sleep "pause" seconds a step: for the signal tests).
"""

from __future__ import annotations

import gc
import os
import sys
import weakref

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared kit
import trl  # noqa: E402
from kit import ecosystem as eco  # noqa: E402
from kit import library_jobs as jobs  # noqa: E402
from peft import LoraConfig  # noqa: E402


def guess_rollout(prompts, trainer):
    """A custom rollout (an environment instead of `generate`): each completion a guess drawn from
    torch's generator, then EOS; the guesses also go to the reward function as a field of their own."""
    import torch

    tok = trainer.processing_class
    guesses = torch.randint(0, 20, (len(prompts),)).tolist()
    return {
        "prompt_ids": [tok(p, add_special_tokens=False)["input_ids"] for p in prompts],
        "completion_ids": [[tok.convert_tokens_to_ids(str(g)), tok.eos_token_id] for g in guesses],
        "logprobs": [[0.0, 0.0] for _ in guesses],
        "guess": guesses,
    }


def reward_guess(completions, prompts, guess, **kwargs):
    """How close the rollout's guess is to the prompt's sum ("what is 3 plus 4 ?")."""
    sums = [min(int(p.split()[2]) + int(p.split()[4]), 19) for p in prompts]
    return [-abs(g - s) / 10 for g, s in zip(guess, sums)]


def reward_metrics(prediction):
    """The reward trainer's evaluation predictions: every pair's two scores (no labels: an empty tuple)."""
    import numpy as np

    scores = np.asarray(prediction.predictions).reshape(-1)
    return {
        "mean_score": float(scores.mean()),
        "top_score": float(scores.max()),
        "labels": len(prediction.label_ids),
    }


def build(scenario: str, tok, out: str, cfg: dict, **overrides):
    kw = dict(
        output_dir=out,
        max_steps=4,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        logging_steps=1,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_tqdm=True,
        seed=5,
    )
    if scenario == "reward_bf16":  # RewardConfig's own default, over 20 steps
        kw.update(bf16=True, max_steps=20)
    kw.update(cfg.get("args", {}), **overrides)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    common = dict(processing_class=tok, callbacks=jobs.callbacks(cfg))
    if scenario.startswith("sft"):
        if scenario == "sft_pack":
            kw.update(packing=True, max_length=24)
        if scenario == "sft_padding_free":  # TRL's own padding_free (its collator flattens the batch)
            kw.update(padding_free=True, max_length=None)
        args = trl.SFTConfig(**kw)
        peft = lora if scenario == "sft_lora" else None
        return trl.SFTTrainer(
            model=eco.llama(tok),
            args=args,
            train_dataset=eco.completions(),
            eval_dataset=eco.completions(8, 9),
            peft_config=peft,
            **common,
        )
    if scenario.startswith("dpo"):
        args = trl.DPOConfig(**kw)
        data = dict(train_dataset=eco.preferences(), eval_dataset=eco.preferences(8, 9))
        if scenario == "dpo":
            return trl.DPOTrainer(model=eco.llama(tok), ref_model=eco.llama(tok), args=args, **data, **common)
        if scenario == "dpo_lora":
            return trl.DPOTrainer(model=eco.llama(tok), args=args, peft_config=lora, **data, **common)
        folder = os.path.join(os.path.dirname(out), "base_model")
        if not os.path.isdir(folder):
            eco.llama(tok).save_pretrained(folder)
        return trl.DPOTrainer(model=folder, ref_model=None, args=args, **data, **common)
    if scenario.startswith("reward"):
        args = trl.RewardConfig(**kw)
        return trl.RewardTrainer(
            model=eco.llama_classifier(tok),
            args=args,
            train_dataset=eco.preferences(),
            eval_dataset=eco.preferences(8, 9),
            compute_metrics=reward_metrics if scenario == "reward_metrics" else None,
            **common,
        )
    if scenario.startswith("grpo"):
        kw.update(num_generations=4, max_completion_length=8)
        if scenario == "grpo_entropy":  # the target above any entropy: the coefficient grows every step
            kw.update(
                entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0, entropy_coef_delta=0.05
            )
        args = trl.GRPOConfig(**kw)
        rollout = dict(rollout_func=guess_rollout) if scenario == "grpo_rollout" else {}
        return trl.GRPOTrainer(
            model=eco.llama(tok),
            reward_funcs=reward_guess if rollout else eco.reward_len,
            args=args,
            train_dataset=eco.prompts(),
            eval_dataset=eco.prompts(8, 9),
            **rollout,
            **common,
        )
    return build_more(scenario, tok, kw, common)


def build_more(scenario: str, tok, kw: dict, common: dict):
    """The other TRL trainers: KTO, RLOO, distillation, and the experimental ORPO, CPO and GKD."""
    kw = {**kw, "eval_strategy": "no"}  # trained only
    if scenario == "kto":
        from datasets import Dataset

        rows = [
            {"prompt": r["prompt"], "completion": r[side], "label": side == "chosen"}
            for r in eco.preferences()
            for side in ("chosen", "rejected")
        ]
        return trl.KTOTrainer(
            model=eco.llama(tok),
            ref_model=eco.llama(tok),
            args=trl.KTOConfig(**kw),
            train_dataset=Dataset.from_list(rows),
            **common,
        )
    if scenario == "rloo":
        args = trl.RLOOConfig(**kw, num_generations=4, max_completion_length=8, beta=0.0)
        return trl.RLOOTrainer(
            model=eco.llama(tok),
            reward_funcs=eco.reward_len,
            args=args,
            train_dataset=eco.prompts(),
            **common,
        )
    if scenario == "distillation":
        args = trl.DistillationConfig(**kw, max_completion_length=8)
        return trl.DistillationTrainer(
            model=eco.llama(tok),
            teacher_model=eco.llama(tok, seed=1),
            args=args,
            train_dataset=eco.completions(),
            **common,
        )
    return build_experimental(scenario, tok, kw, common)


def build_experimental(scenario: str, tok, kw: dict, common: dict):
    if scenario in ("orpo", "cpo"):
        from trl.experimental import cpo, orpo

        trainer, config = (
            (orpo.ORPOTrainer, orpo.ORPOConfig) if scenario == "orpo" else (cpo.CPOTrainer, cpo.CPOConfig)
        )
        return trainer(model=eco.llama(tok), args=config(**kw), train_dataset=eco.preferences(), **common)
    if scenario == "gkd":
        from datasets import Dataset
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        chats = Dataset.from_list(
            [
                {
                    "messages": [
                        {"role": "user", "content": r["prompt"]},
                        {"role": "assistant", "content": r["completion"]},
                    ]
                }
                for r in eco.completions()
            ]
        )
        return GKDTrainer(
            model=eco.llama(tok),
            teacher_model=eco.llama(tok, seed=1),
            args=GKDConfig(**kw, max_new_tokens=4),
            train_dataset=chats,
            **common,
        )
    raise ValueError(f"unknown scenario {scenario!r}")


def accumulation(tok, cfg: dict) -> dict:
    """SFT, one step: a batch of 4 against two micro-batches of 2 (completions of different lengths)."""
    runs = {}
    for bs, ga in ((4, 1), (2, 2)):
        out = os.path.join(cfg["root"], f"sft_ga{ga}")
        trainer = build(
            "sft",
            tok,
            out,
            cfg,
            per_device_train_batch_size=bs,
            gradient_accumulation_steps=ga,
            max_steps=1,
            eval_strategy="no",
            save_strategy="no",
            learning_rate=1e-2,
            optim="sgd",
        )
        trainer.train()
        runs[ga] = (jobs.weights(trainer), trainer.state.log_history[0]["loss"])
    (w1, l1), (w2, l2) = runs[1], runs[2]
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    return {"max_weight_difference": diff, "losses": [l1, l2]}


def lifetime(tok, cfg: dict) -> dict:
    """SFT (full and LoRA), trained without evaluation: whether `del trainer` frees the model at once
    (by reference counting, no cycle through the trainer). With evaluation on, TRL's trainers keep
    theirs in cycles of their own on either library."""
    freed = {}
    for scenario in ("sft", "sft_lora"):
        out = os.path.join(cfg["root"], f"{scenario}_lifetime")
        trainer = build(scenario, tok, out, cfg, max_steps=2, eval_strategy="no")
        trainer.train()
        model = weakref.ref(trainer.model)
        gc.collect()  # what the run left in cycles (lazy imports' frames among them) goes first
        gc.disable()
        try:
            del trainer
            freed[scenario] = model() is None
        finally:
            gc.enable()
    return freed


def run(cfg: dict) -> dict:
    tok = eco.tokenizer(cfg["tokenizer"])

    def build_one(scenario: str, out: str, cfg: dict, **overrides):
        return build(scenario, tok, out, cfg, **overrides)

    report = {name: jobs.run_scenario(build_one, name, cfg) for name in cfg.get("scenarios", [])}
    if cfg.get("accumulation"):
        report["accumulation"] = accumulation(tok, cfg)
    if cfg.get("lifetime"):
        report["lifetime"] = lifetime(tok, cfg)
    return report


if __name__ == "__main__":
    jobs.main(run)
