"""Helpers the tests share that are not pytest fixtures: where things are, and the environment of a job
run in a process of its own (tests/jobs/)."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
JOBS = TESTS / "jobs"


def job(name: str) -> str:
    """The path of a job script in tests/jobs/."""
    return str(JOBS / name)


def job_env(*paths: str, **extra: str) -> dict[str, str]:
    """os.environ for a job process: no launcher's rank variables, and on PYTHONPATH the test helpers,
    the trainwright this test imports (a worktree's src/) and `paths`."""
    import trainwright

    src = os.path.dirname(os.path.dirname(os.path.abspath(trainwright.__file__)))
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [*paths, str(TESTS), src, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env.update(extra)
    return env
