"""One `train()` call's state in owned parts: the run (`TrainingRun`), its frozen plan, its position in the data, its loss log, its divergence note and its training mode."""
