"""Checkpoint folders: the Stateful parts a checkpoint holds (manager.py), atomic writes, discovery and
rotation (folder.py), the manifest (manifest.py) and the checks of a folder and its JSON state (verify.py,
state_checks.py), file formats (files.py, weights.py), RNG state, and
`async_save`'s host snapshots and background writer (snapshot.py, async_writer.py).
The names callers use are re-exported here."""

from trainwright.checkpoint.files import (
    CHECKPOINT_COMPLETE_NAME,
    DATA_STATE_NAME,
    OPTIMIZER_NAME,
    PREFIX_CHECKPOINT_DIR,
    PT_WEIGHTS_INDEX_NAME,
    PT_WEIGHTS_NAME,
    RNG_STATE_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_BIN_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    CheckpointFileNotFoundError,
    read_json,
    safe_torch_load,
    save_torch_state,
    write_json,
    write_training_args,
)
from trainwright.checkpoint.folder import (
    clean_checkpoint_leftovers,
    delete_checkpoint,
    get_last_checkpoint,
    refuse_if_moved,
    rotate_checkpoints,
    sort_checkpoints,
    write_checkpoint,
)
from trainwright.checkpoint.rng import (
    capture_rng_state,
    load_rng_state,
    restore_rng_state,
    rng_state_file,
    save_rng_state,
)
from trainwright.checkpoint.state_checks import check_data_state
from trainwright.checkpoint.verify import check_checkpoint_files, verify_checkpoint
from trainwright.checkpoint.weights import WeightsLoadResult, load_model_weights, save_model_weights
from trainwright.core.units import parse_size

__all__ = [
    "CHECKPOINT_COMPLETE_NAME",
    "DATA_STATE_NAME",
    "OPTIMIZER_NAME",
    "PREFIX_CHECKPOINT_DIR",
    "PT_WEIGHTS_INDEX_NAME",
    "PT_WEIGHTS_NAME",
    "RNG_STATE_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "TRAINER_STATE_NAME",
    "TRAINING_ARGS_BIN_NAME",
    "TRAINING_ARGS_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "CheckpointError",
    "CheckpointFileNotFoundError",
    "WeightsLoadResult",
    "capture_rng_state",
    "check_checkpoint_files",
    "check_data_state",
    "clean_checkpoint_leftovers",
    "delete_checkpoint",
    "get_last_checkpoint",
    "load_model_weights",
    "load_rng_state",
    "parse_size",
    "read_json",
    "refuse_if_moved",
    "restore_rng_state",
    "rng_state_file",
    "rotate_checkpoints",
    "safe_torch_load",
    "save_model_weights",
    "save_rng_state",
    "save_torch_state",
    "sort_checkpoints",
    "verify_checkpoint",
    "write_checkpoint",
    "write_json",
    "write_training_args",
]
