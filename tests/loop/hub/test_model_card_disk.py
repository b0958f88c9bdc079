"""The model card on a full disk (a real tmpfs filled to the page): `create_model_card` raises an
error naming README.md and the full disk, and the card already there stays whole."""

from __future__ import annotations

import os

import pytest
from conftest import RegressionDataset, RegressionModel
from kit.faults import mounted_tmpfs

from trainwright import Trainer, TrainingArguments
from trainwright.checkpoint.files import CheckpointError

PAGE = 4096


def test_a_full_disk_leaves_the_old_card_whole_and_names_readme(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        out = os.path.join(disk, "out")
        args = TrainingArguments(
            output_dir=out, max_steps=2, report_to="none", use_cpu=True, disable_tqdm=True
        )
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())
        trainer.train()
        trainer.create_model_card(model_name="first")
        readme = os.path.join(out, "README.md")
        with open(readme) as f:
            old = f.read()
        st = os.statvfs(disk)
        with open(os.path.join(disk, "filler"), "wb") as f:  # one free page left
            f.write(b"\0" * (st.f_bfree * st.f_frsize - PAGE))
        tags = [f"a-rather-long-tag-number-{i}" for i in range(400)]  # a card of several pages
        with pytest.raises(CheckpointError) as info:
            trainer.create_model_card(model_name="second", tags=tags)
        text = str(info.value)
        assert readme in text and "disk is full" in text, text
        with open(readme) as f:
            assert f.read() == old  # not a fragment of the new card
        assert sorted(os.listdir(out)) == sorted(n for n in os.listdir(out) if not n.startswith(".README"))
