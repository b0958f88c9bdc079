"""Processes and devices: the runtime (ranks, collectives, DDP), FSDP2, DeepSpeed, preemption signals."""
