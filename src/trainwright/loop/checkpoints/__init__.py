"""A run's checkpoints: the checkpointer (saves, their completion, restores), the parts a checkpoint holds (the position's among them), the callbacks' states, the rules a resume checks."""
