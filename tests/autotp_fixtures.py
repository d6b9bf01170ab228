"""DeepSpeed AutoTP (tensor parallelism) + ZeRO checkpoints for tests: a tiny CogVideoX transformer trained by
scripts/make_autotp_checkpoint.py on CPU ranks, made once and cached like the other DeepSpeed fixtures."""

from __future__ import annotations

from cogvideox_fixtures import tiny_pipeline
from fixtures import SCRIPTS, DeepSpeedFixture, cached_fixture

_SCRIPTS = ("make_autotp_checkpoint.py", "finetune_tiny_cogvideox.py", "tiny_training.py", "deepspeed_cpu.py",
            "make_deepspeed_checkpoint.py", "make_tiny_cogvideox.py", "cogvideox_tiny_configs.py", "tiny_models.py")


def autotp_run(stage: int, dtype: str, world_size: int = 4, tp: int = 2, norm_allreduce: bool = True
               ) -> DeepSpeedFixture:
    """The tiny t2v CogVideoX transformer trained 2 steps under AutoTP (``tp`` ranks) x ZeRO-``stage``, with the base
    pipeline it started from; OUT/checkpoint is the save dir. Without ``norm_allreduce`` the TP ranks' copies of the
    per-head norms drift apart."""
    base = tiny_pipeline("t2v")
    command = [str(SCRIPTS / "make_autotp_checkpoint.py"), str(base), "--tp", str(tp), "--world-size",
               str(world_size), "--stage", str(stage), "--dtype", dtype]
    name = f"autotp-cogvideox-tp{tp}-ws{world_size}-zero{stage}-{dtype}"
    if not norm_allreduce:
        command.append("--no-norm-allreduce")
        name += "-drifted"
    return DeepSpeedFixture(cached_fixture(name, _SCRIPTS, command), base)
