"""Hyperparameter search: `hyperparameter_search` with optuna or Ray Tune."""
