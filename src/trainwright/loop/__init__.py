"""The Trainer family: the loop, evaluation, checkpointing glue, hyperparameter search, Hub pushes."""
