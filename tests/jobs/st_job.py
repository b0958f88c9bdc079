"""sentence-transformers' trainers on tiny offline models, as its users write them (only
sentence-transformers, datasets and transformers are imported): run with `python st_job.py CFG` they
train on transformers, with `python -m trainwright run st_job.py CFG` on trainwright
(tests/app/test_sentence_transformers.py runs both).

CFG is JSON: {"scenarios": [...], "root": dir, "report": file.json, options}. The models are BERTs built
from configs and saved with their tokenizer, then loaded by the library from the folder, as a user
loads a checkpoint from the Hub (`from_pretrained`: the transformer starts in evaluation mode).
Scenarios: st (a bi-encoder, in-batch negatives, an evaluator and an evaluation loss), st_cosine
(scored pairs: a label column), st_init (`model_init`), st_lora (a LoRA adapter), cross (a
cross-encoder reranker), sparse (SPLADE), multi_vector (late interaction). Each trains 4 steps with a
checkpoint every 2 and reports its log history, files, final weights, and whether the library loads
what was saved (the final folder and checkpoint-4) to the trained model's outputs. Options as
kit/library_jobs.py's (resumed, async, only_resume, announce/pause), "args" (arguments over the
scenarios' own) and "scenario_args" ({scenario: arguments} over those).
"""

from __future__ import annotations

import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared kit
import transformers  # noqa: E402
from datasets import Dataset  # noqa: E402
from kit import ecosystem as eco  # noqa: E402
from kit import library_jobs as jobs  # noqa: E402
from sentence_transformers import (  # noqa: E402
    CrossEncoder,
    CrossEncoderTrainer,
    CrossEncoderTrainingArguments,
    MultiVectorEncoder,
    MultiVectorEncoderTrainer,
    MultiVectorEncoderTrainingArguments,
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
    SparseEncoder,
    SparseEncoderTrainer,
    SparseEncoderTrainingArguments,
)

BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
HEADS = {"bert": transformers.BertModel, "cls": transformers.BertForSequenceClassification}
HEADS["mlm"] = transformers.BertForMaskedLM


def model_folder(root: str, head: str) -> str:
    """A BERT (`head`: bert, cls or mlm) and the word-level tokenizer, saved in root/<head> once."""
    folder = os.path.join(root, "models", head)
    if not os.path.isdir(folder):
        tok = eco.tokenizer(os.path.join(root, "models", "tokenizer"))
        config = transformers.BertConfig(
            vocab_size=len(tok),
            max_position_embeddings=64,
            pad_token_id=tok.pad_token_id,
            num_labels=1,
            **BERT,
        )
        torch.manual_seed(0)
        model = HEADS[head](config)

        def save(path: str) -> None:
            model.save_pretrained(path)
            tok.save_pretrained(path)

        eco.save_once(folder, save)  # once, whichever rank of a torchrun job comes first
    return folder


def _sums(n: int, seed: int) -> list[tuple[int, int]]:
    r = random.Random(seed)
    return [(r.randint(0, 9), r.randint(0, 9)) for _ in range(n)]


def pairs(n: int, seed: int) -> Dataset:
    """(anchor, positive) rows: a question and its answer."""
    return Dataset.from_list(
        [
            {"anchor": f"what is {a} plus {b} ?", "positive": f"the answer is {min(a + b, 19)}"}
            for a, b in _sums(n, seed)
        ]
    )


def scored(n: int, seed: int) -> Dataset:
    """(sentence1, sentence2, score) rows: an answer scored 1 when right, 0 when wrong."""
    rows = []
    for i, (a, b) in enumerate(_sums(n, seed)):
        right = i % 2 == 0
        answer = min(a + b, 19) if right else (a + b + 3) % 20
        rows.append(
            {
                "sentence1": f"what is {a} plus {b} ?",
                "sentence2": f"the answer is {answer}",
                "score": float(right),
            }
        )
    return Dataset.from_list(rows)


def arguments(cls, scenario: str, out: str, cfg: dict, **overrides):
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
        seed=5,
        disable_tqdm=True,
    )
    kw.update(cfg.get("args", {}))
    kw.update(cfg.get("scenario_args", {}).get(scenario, {}))
    kw.update(overrides)
    return cls(**kw)


def build(scenario: str, out: str, cfg: dict, **overrides):
    root = cfg["root"]
    common = dict(callbacks=jobs.callbacks(cfg))
    if scenario in ("st", "st_cosine", "st_init", "st_lora"):
        from sentence_transformers import losses
        from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

        folder = model_folder(root, "bert")
        args = arguments(SentenceTransformerTrainingArguments, scenario, out, cfg, **overrides)
        ev = scored(8, 9)
        evaluator = EmbeddingSimilarityEvaluator(ev["sentence1"], ev["sentence2"], ev["score"], name="sums")
        if scenario == "st_cosine":
            model = SentenceTransformer(folder)
            loss = losses.CosineSimilarityLoss(model)
            data = dict(train_dataset=scored(24, 0), eval_dataset=ev)
            return SentenceTransformerTrainer(
                model=model, args=args, loss=loss, evaluator=evaluator, **data, **common
            )
        data = dict(train_dataset=pairs(24, 0), eval_dataset=pairs(8, 9))
        if scenario == "st_init":
            return SentenceTransformerTrainer(
                model_init=lambda: SentenceTransformer(folder),
                args=args,
                loss=losses.MultipleNegativesRankingLoss,  # a function of the model, as for a search
                evaluator=evaluator,
                **data,
                **common,
            )
        model = SentenceTransformer(folder)
        if scenario == "st_lora":
            from peft import LoraConfig

            model.add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]))
        loss = losses.MultipleNegativesRankingLoss(model)
        return SentenceTransformerTrainer(
            model=model, args=args, loss=loss, evaluator=evaluator, **data, **common
        )
    return build_other(scenario, out, cfg, common, overrides)


def build_other(scenario: str, out: str, cfg: dict, common: dict, overrides: dict):
    """The cross-encoder, sparse and multi-vector trainers."""
    root = cfg["root"]
    if scenario == "cross":
        from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

        model = CrossEncoder(model_folder(root, "cls"))
        args = arguments(CrossEncoderTrainingArguments, scenario, out, cfg, **overrides)
        return CrossEncoderTrainer(
            model=model,
            args=args,
            train_dataset=scored(24, 0),
            eval_dataset=scored(8, 9),
            loss=BinaryCrossEntropyLoss(model),
            **common,
        )
    if scenario == "sparse":
        from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss

        model = SparseEncoder(model_folder(root, "mlm"))
        args = arguments(SparseEncoderTrainingArguments, scenario, out, cfg, **overrides)
        loss = SpladeLoss(
            model,
            SparseMultipleNegativesRankingLoss(model),
            document_regularizer_weight=3e-5,
            query_regularizer_weight=5e-5,
        )
        return SparseEncoderTrainer(
            model=model, args=args, train_dataset=pairs(24, 0), eval_dataset=pairs(8, 9), loss=loss, **common
        )
    if scenario == "multi_vector":
        from sentence_transformers.multi_vector_encoder.losses import MultiVectorMultipleNegativesRankingLoss

        model = MultiVectorEncoder(model_folder(root, "bert"))
        args = arguments(MultiVectorEncoderTrainingArguments, scenario, out, cfg, **overrides)
        return MultiVectorEncoderTrainer(
            model=model,
            args=args,
            train_dataset=pairs(24, 0),
            eval_dataset=pairs(8, 9),
            loss=MultiVectorMultipleNegativesRankingLoss(model),
            **common,
        )
    raise ValueError(f"unknown scenario {scenario!r}")


LOADERS = {"cross": CrossEncoder, "sparse": SparseEncoder, "multi_vector": MultiVectorEncoder}
PROBE = ["what is 3 plus 4 ?", "the answer is 7", "what is 9 plus 9 ?"]


def outputs(model, scenario: str) -> torch.Tensor:
    """What a user asks the trained model for: scores of a cross-encoder, embeddings otherwise."""
    with torch.no_grad():
        if scenario == "cross":
            return torch.as_tensor(model.predict([(PROBE[0], PROBE[1]), (PROBE[2], PROBE[1])]))
        if scenario == "multi_vector":  # one tensor of token vectors per text
            return torch.cat([torch.as_tensor(e).flatten() for e in model.encode(PROBE)])
        encoded = model.encode(PROBE, convert_to_tensor=True)
        return encoded.to_dense() if encoded.is_sparse else encoded


def loadable(scenario: str, trainer, out: str) -> dict:
    """The library loads the saved model (the output folder, then checkpoint-4) to the same outputs."""
    loader = LOADERS.get(scenario, SentenceTransformer)
    trainer.model.eval()
    expected = outputs(trainer.model, scenario)
    same = {}
    for folder in (out, os.path.join(out, "checkpoint-4")):
        loaded = loader(folder)
        same[os.path.basename(folder)] = bool(torch.allclose(outputs(loaded, scenario), expected, atol=1e-6))
    return {"loads_back": same}


def run(cfg: dict) -> dict:
    return {name: jobs.run_scenario(build, name, cfg, checks=loadable) for name in cfg.get("scenarios", [])}


if __name__ == "__main__":
    jobs.main(run)
