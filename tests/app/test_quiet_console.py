"""No third-party noise the user did not ask for: a Trainer run with a transformers model, checkpoints,
best-model loading and a resume, in a fresh process, must not import DeepSpeed (accelerate would, on
every save_pretrained, printing its "Setting accelerator to CPU" warning on machines without a GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")
if importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("accelerate") is None:
    pytest.skip(
        "needs deepspeed and accelerate installed (the combination that imported deepspeed)",
        allow_module_level=True,
    )

JOB = textwrap.dedent(
    """
    import sys
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from trainwright import Trainer, TrainingArguments

    def model():
        torch.manual_seed(0)
        config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                            bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
        return GPT2LMHeadModel(config)

    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.randint(0, 64, (8,))} for _ in range(16)]

    def args(steps):
        return TrainingArguments(
            output_dir=sys.argv[1], max_steps=steps, per_device_train_batch_size=4, report_to="none",
            save_steps=2, eval_strategy="steps", eval_steps=2, logging_steps=2,
            load_best_model_at_end=True, disable_tqdm=True, use_cpu=True,
        )

    Trainer(model=model(), args=args(4), train_dataset=data, eval_dataset=data[:4]).train()
    trainer = Trainer(model=model(), args=args(6), train_dataset=data, eval_dataset=data[:4])
    trainer.train(resume_from_checkpoint=True)
    trainer.save_model()
    trainer.predict(data[:4])
    print("DEEPSPEED_IMPORTED", "deepspeed" in sys.modules, flush=True)
    print("=== DeepSpeed in use from here ===", flush=True)
    sys.stderr.flush()

    # Once DeepSpeed is imported (its integration, or the user), accelerate sees it again.
    import deepspeed  # noqa: F401
    import accelerate.utils.other as other
    from trainwright.core.third_party import deepspeed_left_unimported

    with deepspeed_left_unimported():
        print("ACCELERATE_SEES_DEEPSPEED", other.is_deepspeed_available(), flush=True)
    """
)


def test_a_run_without_deepspeed_never_imports_it(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    proc = subprocess.run(
        [sys.executable, str(job), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    before, _, after = proc.stdout.partition("=== DeepSpeed in use from here ===")
    assert "DEEPSPEED_IMPORTED False" in before
    assert "ACCELERATE_SEES_DEEPSPEED True" in after
    # DeepSpeed logs its warning to stdout (it does appear after the marker here on a CPU machine)
    for text in (before, proc.stderr):
        noisy = [
            line for line in text.splitlines() if "real_accelerator" in line or "Setting accelerator" in line
        ]
        assert noisy == []


def test_overlapping_blocks_in_two_threads_put_accelerate_back_once_all_end():
    import threading

    import accelerate.utils.other as other

    from trainwright.core.third_party import deepspeed_left_unimported

    if "deepspeed" in sys.modules:
        pytest.skip("deepspeed is already imported in this process: the block rightly changes nothing")
    original = other.is_deepspeed_available
    inside, leave = threading.Event(), threading.Event()

    def worker():
        with deepspeed_left_unimported():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=worker)
    with deepspeed_left_unimported():
        thread.start()
        assert inside.wait(10)
        assert other.is_deepspeed_available() is False
    assert other.is_deepspeed_available() is False  # the worker's block is still open
    leave.set()
    thread.join()
    assert other.is_deepspeed_available is original
    assert "deepspeed" not in sys.modules
