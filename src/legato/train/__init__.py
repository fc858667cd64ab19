"""Training: config, the FSDP2 trainer, checkpoints, metrics and progress.

Public API::

    TrainConfig, load_config(path=None, overrides=None) -> TrainConfig   # train.config
    config.job(spec, world) -> parallel.job.Job                         # train.config
    Trainer(config).fit() -> TrainResult                                 # train.trainer

The config half imports no torch, so ``legato train --help-config`` and config errors
answer at once; the trainer is imported on first use.
"""

from legato.train.config import TrainConfig, load_config

__all__ = ["TrainConfig", "TrainResult", "Trainer", "load_config"]


def __getattr__(name: str):
    if name in ("Trainer", "TrainResult"):
        from legato.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'legato.train' has no attribute {name!r}")
