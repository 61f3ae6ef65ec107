"""A training stopped under one layout of a model-splitting preset continues exactly under another layout of it:
the per-step losses are the uninterrupted single-device run's, in one wandb run. Pipelines side by side continue as
one pipeline, of as many stages or of others (the stages' checkpoint names each parameter and its optimizer state as
one device does, pipelining.single_device_name, so each stage reads its own entries whatever the split); HSDP
continues as FSDP on fewer shards (DCP reshards). The data position counts global batches, so it does not depend on
the layout either. (Another preset altogether, ddp -> pipeline say, is refused in one line: tests/test_resuming.py;
model_parallel on another tensor-parallel size too: test_resume.py.)"""

import pytest
from conftest import QUICK, TOLERANCE, make_runner
from engine_specific import launcher_of

# Shuffled, so the data position matters; a checkpoint every 2 steps. A constant learning rate: a schedule spans
# trainer.max_steps, which changes between the two starts (4, then 8).
SETTINGS = [*QUICK, "trainer.accelerator=cpu", "data.shuffle=true", "data.train_size=512", "data.batch_size=64",
            "checkpoint.every_n_steps=2", "scheduler=constant"]  # fmt: skip
STEPS = 8


# (name, the first start's layout, the layout it continues on): the same preset, another number of processes.
CHANGES = [
    # 2 pipelines x 2 stages -> 1 pipeline of 2 stages.
    ("pipelines-2x2-to-1x2", ["strategy=pipeline", "trainer.devices=4", "strategy.data_parallel_size=2"],
     ["strategy=pipeline", "trainer.devices=2"]),
    # 2 pipelines x 2 stages -> 1 pipeline of 4 stages: every stage's parameters come from other stages' parts.
    ("pipelines-2x2-to-1x4", ["strategy=pipeline", "trainer.devices=4", "strategy.data_parallel_size=2"],
     ["strategy=pipeline", "trainer.devices=4"]),
    # HSDP, 2 replicas x 2 shards -> FSDP over 2 shards: DCP reshards the net and the optimizer state.
    ("hsdp-2x2-to-fsdp-2", ["strategy=fsdp", "trainer.devices=4", "strategy.replicas=2"],
     ["strategy=fsdp", "trainer.devices=2"]),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name, before, after", CHANGES, ids=[name for name, *_ in CHANGES])
def test_a_stopped_training_continues_exactly_on_another_layout(tmp_path, train_env, name, before, after):
    train = make_runner(tmp_path, train_env)
    single = train(*SETTINGS, f"trainer.max_steps={STEPS}", "strategy=single").losses(STEPS)
    assert len(single) == STEPS

    run_dir, preset = tmp_path / name, before[0].removeprefix("strategy=")
    first = train(*SETTINGS, "trainer.max_steps=4", *before, launcher=launcher_of(preset, 4), run_dir=run_dir)
    assert first.losses(STEPS) == pytest.approx(single[:4], abs=TOLERANCE)
    # The same run folder: resumes from step 4, on the other layout.
    processes = int(next(o for o in after if o.startswith("trainer.devices=")).partition("=")[2])
    again = train(*SETTINGS, f"trainer.max_steps={STEPS}", *after, launcher=launcher_of(preset, processes),
                  run_dir=run_dir)  # fmt: skip
    assert "resuming from" in again.output
    assert again.losses(STEPS + 1) == pytest.approx(single, abs=TOLERANCE)  # one wandb run, each step once
