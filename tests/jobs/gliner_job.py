"""GLiNER (gliner 0.2.29, its own `gliner.training.Trainer` and `TrainingArguments`) on a tiny offline
model, as its users train it (only gliner, tokenizers and transformers are imported): run with
`python gliner_job.py CFG` it trains on transformers, with `python -m trainwright run gliner_job.py CFG`
on trainwright (tests/app/test_gliner.py runs both, in .venv-gliner: gliner needs transformers < 5.17).

CFG is JSON: {"scenarios": [...], "root": dir, "report": file.json, options}. GLiNER loads its backbone
by name through transformers' Auto classes, so a 2-layer BERT and a word-level fast tokenizer (with
[CLS]/[SEP] around each text) are saved into a folder that the GLiNER config names. The data are
made here: short sentences with person, location and organization spans. Scenarios:

* gliner: the Trainer built as GLiNER's examples build it (`gliner.training.Trainer` with its
  `TrainingArguments` and the model's span collator), evaluated every 2 steps;
* train_model: GLiNER's README path, `model.train_model(...)` with `create_training_args`' defaults
  (one loader worker, warm-up, no masking), evaluated every 2 steps (it trains inside, so it has no
  resume or background-save check).

Each trains 4 steps with a checkpoint every 2 and reports its log history, files, final weights, and
whether `GLiNER.from_pretrained` loads what was saved (the output folder and checkpoint-4) to the
trained model's predictions. Options as kit/library_jobs.py's (resumed, async, only_resume,
announce/pause).

GLiNER builds each batch's label prompt from a `set` of label strings, whose order follows the
process's string hashes: two processes build the same batches only under the same PYTHONHASHSEED
(kit/library_runs.py sets it for both libraries).
"""

from __future__ import annotations

import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared kit
import transformers  # noqa: E402
from gliner import GLiNER  # noqa: E402
from gliner.data_processing.collator import UniEncoderSpanDataCollator  # noqa: E402
from gliner.training import Trainer, TrainingArguments  # noqa: E402
from kit import library_jobs as jobs  # noqa: E402

PEOPLE = ["alice", "bob", "carol", "dave"]
PLACES = ["paris", "rome", "oslo", "lima"]
ORGS = ["acme", "globex", "initech"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = SPECIAL + ["lives", "in", "works", "at", "visited", "and", ".", "person", "location", "organization"]
WORDS += PEOPLE + PLACES + ORGS
BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def backbone(root: str) -> str:
    """A BERT and its word-level fast tokenizer, saved in root/models/bert once."""
    folder = os.path.join(root, "models", "bert")
    if not os.path.isdir(folder):
        from tokenizers import Tokenizer, models, pre_tokenizers, processors

        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
        )
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
        )
        config = transformers.BertConfig(
            vocab_size=len(WORDS), max_position_embeddings=64, pad_token_id=0, **BERT
        )
        torch.manual_seed(0)
        transformers.BertModel(config).save_pretrained(folder)
        fast.save_pretrained(folder)
    return folder


def examples(n: int, seed: int) -> list[dict]:
    """GLiNER's training format: words and inclusive [start, end, label] spans."""
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        p, q, o = r.choice(PEOPLE), r.choice(PLACES), r.choice(ORGS)
        if r.random() < 0.5:
            rows.append(
                {"tokenized_text": [p, "lives", "in", q, "."], "ner": [[0, 0, "person"], [3, 3, "location"]]}
            )
        else:
            rows.append(
                {
                    "tokenized_text": [p, "works", "at", o, "and", "visited", q],
                    "ner": [[0, 0, "person"], [3, 3, "organization"], [6, 6, "location"]],
                }
            )
    return rows


def model(root: str) -> GLiNER:
    """A fresh uni-encoder span GLiNER over the BERT (its own layers seeded)."""
    config = {"model_name": backbone(root), "hidden_size": 32, "max_width": 4, "max_len": 32}
    torch.manual_seed(0)  # after the backbone is saved: every build draws the same head
    return GLiNER.from_config(config)


COMMON = dict(
    max_steps=4,
    per_device_train_batch_size=4,
    per_device_eval_batch_size=4,
    logging_steps=1,
    save_steps=2,
    eval_strategy="steps",
    eval_steps=2,
    report_to="none",
    use_cpu=True,
    seed=5,
    disable_tqdm=True,
    learning_rate=1e-3,
)


def build(scenario: str, out: str, cfg: dict, **overrides) -> Trainer:
    if scenario != "gliner":
        raise ValueError(f"unknown scenario {scenario!r}")
    gliner = model(cfg["root"])
    args = TrainingArguments(
        output_dir=out,
        others_lr=1e-3,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        **{**COMMON, **overrides},
    )
    collator = UniEncoderSpanDataCollator(
        gliner.config, data_processor=gliner.data_processor, prepare_labels=True
    )
    return Trainer(
        model=gliner,
        args=args,
        train_dataset=examples(24, 0),
        eval_dataset=examples(8, 1),
        data_collator=collator,
        processing_class=gliner.data_processor.transformer_tokenizer,
        callbacks=jobs.callbacks(cfg),
    )


PROBE = ["carol works at globex and visited oslo", "bob lives in lima ."]
LABELS = ["person", "location", "organization"]


def predictions(gliner: GLiNER) -> list:
    """What a user asks the trained model for: every span over a low threshold, with its score."""
    gliner.eval()
    found = []
    for text in PROBE:
        for e in gliner.predict_entities(text, LABELS, threshold=0.05):
            found.append((e["start"], e["end"], e["label"], e["score"]))
    return found


def same_predictions(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x[:3] == y[:3] and abs(x[3] - y[3]) <= 1e-6 for x, y in zip(a, b))


def loadable(scenario: str, trainer: Trainer, out: str) -> dict:
    """GLiNER loads the saved model (the output folder, then checkpoint-4) to the same predictions."""
    expected = predictions(trainer.model)
    same = {}
    for folder in (out, os.path.join(out, "checkpoint-4")):
        same[os.path.basename(folder)] = same_predictions(
            predictions(GLiNER.from_pretrained(folder)), expected
        )
    return {"loads_back": same, "predicted": len(expected)}


def train_model(cfg: dict) -> dict:
    """The README path: `train_model` builds its arguments and Trainer and trains."""
    out = os.path.join(cfg["root"], "train_model")
    gliner = model(cfg["root"])
    trainer = gliner.train_model(
        train_dataset=examples(24, 0), eval_dataset=examples(8, 1), output_dir=out, **COMMON
    )
    trainer.save_model()
    return {
        "base": jobs.trainer_base(trainer),
        "history": trainer.state.log_history,
        "files": jobs.folder_files(out),
        "weights_file": jobs.save_weights(trainer, out, "final"),
        **loadable("train_model", trainer, out),
    }


def run(cfg: dict) -> dict:
    return {
        name: train_model(cfg)
        if name == "train_model"
        else jobs.run_scenario(build, name, cfg, checks=loadable)
        for name in cfg.get("scenarios", [])
    }


if __name__ == "__main__":
    jobs.main(run)
