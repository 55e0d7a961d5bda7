"""What ``dsanalyzer profile`` asks the import hook in the training process to do: a run, through env vars.

The CLI writes a :class:`HookConfig` into the child's environment (:meth:`HookConfig.to_env`); the
hook (:mod:`dsanalyzer.intercept`) reads it back (:meth:`HookConfig.from_env`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dsanalyzer.measure.plan import RunPlan

__all__ = ["HookConfig", "ENV_MODE"]

ENV_MODE = "DSANALYZER_MODE"
ENV_RESULT_DIR = "DSANALYZER_RESULT_DIR"
ENV_ITERS = "DSANALYZER_ITERS"
ENV_WARMUP = "DSANALYZER_WARMUP"
ENV_WORKERS_LIST = "DSANALYZER_WORKERS_LIST"
ENV_DATA = "DSANALYZER_DATA"
ENV_BUDGET = "DSANALYZER_MEMORY_BUDGET_BYTES"
ENV_MIN_SECONDS = "DSANALYZER_MIN_SECONDS"
ENV_TUNE_EPOCHS = "DSANALYZER_TUNE_EPOCHS"


@dataclass(frozen=True)
class HookConfig(RunPlan):
    """The run the CLI asked for (a :class:`RunPlan`), where the hook writes its result, and for how long.

    ``result_dir`` and ``min_seconds`` are keyword-only: ``HookConfig("real", 60, result_dir=...)``.
    """

    result_dir: str = field(kw_only=True)
    min_seconds: float = field(default=0.0, kw_only=True)  # measure at least this long, past ``iters``
    # ``fix --online``: the loader tunes itself (tune=True) for at most this many epochs (0: not tuning)
    tune_epochs: int = field(default=0, kw_only=True)

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
            tune_epochs=int(env.get(ENV_TUNE_EPOCHS, "0") or 0),
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
            ENV_TUNE_EPOCHS: str(int(self.tune_epochs)),
        }
        if self.data_path:
            env[ENV_DATA] = self.data_path
        return env
