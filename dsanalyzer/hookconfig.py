"""What ``dsanalyzer profile`` asks the import hook in the training process to do: a run, through env vars.

The CLI writes a :class:`HookConfig` into the child's environment (:meth:`HookConfig.to_env`); the
hook (:mod:`dsanalyzer.intercept`) reads it back (:meth:`HookConfig.from_env`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dsanalyzer.modes import RunPlan

__all__ = ["HookConfig", "ENV_MODE"]

ENV_MODE = "DSANALYZER_MODE"
ENV_RESULT_DIR = "DSANALYZER_RESULT_DIR"
ENV_ITERS = "DSANALYZER_ITERS"
ENV_WARMUP = "DSANALYZER_WARMUP"
ENV_WORKERS_LIST = "DSANALYZER_WORKERS_LIST"
ENV_DATA = "DSANALYZER_DATA"
ENV_BUDGET = "DSANALYZER_MEMORY_BUDGET_BYTES"
ENV_MIN_SECONDS = "DSANALYZER_MIN_SECONDS"


@dataclass
class HookConfig:
    """What the CLI asked the hook to do, read from environment variables."""

    mode: str
    result_dir: str
    iters: int = 100
    warmup: int = 5
    workers_list: tuple[int, ...] = (1,)
    data_path: str | None = None
    memory_budget_bytes: int = 1 << 30
    min_seconds: float = 0.0  # measure for at least this long, even past ``iters`` (short runs are noise)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> HookConfig:
        env = dict(os.environ if env is None else env)
        workers = tuple(int(x) for x in env.get(ENV_WORKERS_LIST, "1").split(",") if x.strip())
        return cls(
            mode=env[ENV_MODE],
            result_dir=env[ENV_RESULT_DIR],
            iters=int(env.get(ENV_ITERS, "100")),
            warmup=int(env.get(ENV_WARMUP, "5")),
            workers_list=workers or (1,),
            data_path=env.get(ENV_DATA) or None,
            memory_budget_bytes=int(env.get(ENV_BUDGET, str(1 << 30))),
            min_seconds=float(env.get(ENV_MIN_SECONDS, "0") or 0),
        )

    def plan(self) -> RunPlan:
        """The run this configuration asks for."""
        return RunPlan(
            self.mode, self.iters, self.warmup, self.workers_list, self.data_path, self.memory_budget_bytes
        )

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_MODE: self.mode,
            ENV_RESULT_DIR: self.result_dir,
            ENV_ITERS: str(self.iters),
            ENV_WARMUP: str(self.warmup),
            ENV_WORKERS_LIST: ",".join(str(k) for k in self.workers_list),
            ENV_BUDGET: str(self.memory_budget_bytes),
            ENV_MIN_SECONDS: repr(float(self.min_seconds)),
        }
        if self.data_path:
            env[ENV_DATA] = self.data_path
        return env
