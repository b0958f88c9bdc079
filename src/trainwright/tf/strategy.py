"""Which `tf.distribute` strategy a run uses, from the arguments, TF_CONFIG and the visible devices."""

from __future__ import annotations

import json
import os
from typing import Any


def _workers_in_tf_config() -> int:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 1
    cluster = json.loads(raw).get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def make_strategy(args: Any) -> Any:
    """The strategy for `args` (a `TFTrainingArguments`).

    - `tpu_name` set: `TPUStrategy` on that TPU (a clear error when it cannot be reached).
    - TF_CONFIG naming several workers: `MultiWorkerMirroredStrategy` (each worker uses its CPU, or
      its GPUs unless `use_cpu`).
    - several GPUs (or several logical CPU devices configured before TensorFlow started, as the
      tests do): `MirroredStrategy` over them.
    - else `OneDeviceStrategy` on the one GPU or the CPU.
    """
    import tensorflow as tf

    if args.tpu_name:
        if not args.tpu_name.startswith("grpc://") and not tf.config.list_physical_devices("TPU"):
            # Resolving a TPU by name asks the GCE metadata server; off Google Cloud that can only fail.
            raise RuntimeError(
                f"tpu_name={args.tpu_name!r}: no TPU could be reached (this machine has no TPU devices and "
                "the name is not a grpc:// address); unset tpu_name to train on the CPU/GPUs of this machine"
            )
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=args.tpu_name, zone=args.tpu_zone, project=args.gcp_project
            )
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except Exception as exc:  # the resolver raises URLError, ValueError, RuntimeError, OpError...
            raise RuntimeError(
                f"tpu_name={args.tpu_name!r}: no TPU could be reached ({type(exc).__name__}: {exc}); "
                "unset tpu_name to train on the CPU/GPUs of this machine"
            ) from exc
        return tf.distribute.TPUStrategy(resolver)

    if _workers_in_tf_config() > 1:
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    gpus = [] if args.use_cpu else tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    if len(gpus) == 1:
        return tf.distribute.OneDeviceStrategy(gpus[0].name)
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) > 1:
        # Cross-device ops default to NCCL, which has no CPU kernel: reduce on the host instead.
        return tf.distribute.MirroredStrategy(
            [d.name for d in cpus], cross_device_ops=tf.distribute.ReductionToOneDevice()
        )
    return tf.distribute.OneDeviceStrategy("/cpu:0")
