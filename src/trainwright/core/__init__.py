"""The bottom layer: run state (`TrainerState`, `TrainerControl`, `LoopCursor`), the event system, enums, seeding. Imports nothing else of trainwright."""
