"""The compiled functions of TFTrainer: one optimizer step, one evaluation step.

One call of the training function is one optimizer step. Every replica receives the step's whole
batch and takes its own rows (so the order of samples does not depend on how TensorFlow would shard
a dataset), splits them into `gradient_accumulation_steps` micro-batches, and sums each
micro-batch's gradient of its summed loss. The sums and item counts are added over replicas, the
gradient is divided by the step's item count (exactly the gradient of the full batch's mean loss),
clipped by its global norm, and applied once.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainwright.tf.data import part, rows, take_rows


def loss_sum_and_items(loss: tf.Tensor, batch_rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A model's loss as (sum, items): a per-example or per-token loss (more than one value) is
    summed over its values; a mean (a scalar, or one value) counts once per sample of the batch."""
    loss = tf.cast(loss, tf.float32)
    if loss.shape.rank == 0 or (loss.shape.rank == 1 and loss.shape[0] == 1):
        n = tf.cast(batch_rows, tf.float32)
        return tf.reshape(loss, []) * n, n
    return tf.reduce_sum(loss), tf.cast(tf.size(loss), tf.float32)


def make_train_function(trainer: Any, may_be_partial: bool) -> Any:
    """The `tf.function` of one optimizer step: (features, labels) -> (mean loss, gradient norm)."""
    strategy = trainer.args.strategy
    replicas = strategy.num_replicas_in_sync
    accumulate = trainer.args.gradient_accumulation_steps
    max_norm = float(trainer.args.max_grad_norm or 0.0)
    model, optimizer = trainer.model, trainer.optimizer
    variables = model.trainable_variables

    def micro_step(features: Any, labels: Any) -> tuple[Any, tf.Tensor, tf.Tensor]:
        n = rows(features)

        def compute() -> tuple[Any, tf.Tensor, tf.Tensor]:
            with tf.GradientTape() as tape:
                loss, _ = trainer.run_model(features, labels, True)
                if loss is None:
                    raise ValueError(
                        "the model returned no loss while training: give the batch's labels (under "
                        f"{(trainer.args.label_names or ['labels'])[0]!r}) to a model that returns (loss, logits)"
                    )
                total, items = loss_sum_and_items(loss, n)
            grads = tape.gradient(total, variables)
            return (
                [
                    tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                    for g, v in zip(grads, variables)
                ],
                total,
                items,
            )

        if not may_be_partial:
            return compute()
        # The last batch of an epoch may leave a replica or micro-batch with no rows.
        return tf.cond(
            n > 0,
            compute,
            lambda: ([tf.zeros_like(v) for v in variables], tf.constant(0.0), tf.constant(0.0)),
        )

    def replica_step(features: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor]:
        if replicas > 1:
            ctx = tf.distribute.get_replica_context()
            start, stop = part(rows(features), ctx.replica_id_in_sync_group, replicas)
            features, labels = take_rows(features, start, stop), take_rows(labels, start, stop)
        grads: list[tf.Tensor] | None = None
        loss_total = tf.constant(0.0)
        items = tf.constant(0.0)
        n = rows(features)
        for i in range(accumulate):
            if accumulate > 1:
                start, stop = part(n, i, accumulate)
                micro = (take_rows(features, start, stop), take_rows(labels, start, stop))
            else:
                micro = (features, labels)
            g, total, count = micro_step(*micro)
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            loss_total += total
            items += count
        assert grads is not None
        if replicas > 1:
            ctx = tf.distribute.get_replica_context()
            loss_total, items = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [loss_total, items])
            if max_norm > 0:  # the global norm needs the summed gradient on every replica
                grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        grads = [g / items for g in grads]
        norm = tf.linalg.global_norm(grads)
        if max_norm > 0:
            grads, _ = tf.clip_by_global_norm(grads, max_norm, use_norm=norm)
            if replicas > 1:  # the optimizer sums over replicas again: hand it each replica's share
                grads = [g / replicas for g in grads]
        elif replicas > 1:
            norm = tf.constant(float("nan"))  # each replica holds only its part of the gradient
        optimizer.apply_gradients(zip(grads, variables))
        return loss_total / items, norm

    def step(features: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor]:
        loss, norm = strategy.run(replica_step, args=(features, labels))
        first = strategy.experimental_local_results
        return first(loss)[0], first(norm)[0]

    return tf.function(step, jit_compile=bool(trainer.args.xla), reduce_retracing=True)


def make_eval_function(trainer: Any, want_logits: bool) -> Any:
    """The `tf.function` of one evaluation step: (features, labels) -> (loss sum, items, logits)."""
    strategy = trainer.args.strategy
    replicas = strategy.num_replicas_in_sync

    def replica_step(features: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor, Any]:
        if replicas > 1:
            ctx = tf.distribute.get_replica_context()
            start, stop = part(rows(features), ctx.replica_id_in_sync_group, replicas)
            features, labels = take_rows(features, start, stop), take_rows(labels, start, stop)
        loss, logits = trainer.run_model(features, labels, False)
        if loss is None:
            total, items = tf.constant(0.0), tf.constant(0.0)
        else:
            total, items = loss_sum_and_items(loss, rows(features))
            total = tf.where(items > 0, total, 0.0)  # an empty replica's mean loss is NaN
        return total, items, (logits if want_logits else tf.zeros([0]))

    def step(features: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor, Any]:
        total, items, logits = strategy.run(replica_step, args=(features, labels))
        if replicas > 1:
            total = strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None)
            items = strategy.reduce(tf.distribute.ReduceOp.SUM, items, axis=None)
            if want_logits:
                logits = tf.nest.map_structure(lambda t: strategy.gather(t, axis=0), logits)
        return total, items, logits

    return tf.function(step, reduce_retracing=True)
