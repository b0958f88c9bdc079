"""Evaluation: the hooks (`evaluate`, `predict`, `evaluation_loop`, `prediction_step`), the loop, the batches cut to their samples, the gathering across processes and the accumulation on the CPU."""
