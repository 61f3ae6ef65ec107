"""A training stopped under one layout continues exactly under another: the per-step losses are the uninterrupted
single-device run's, in one wandb run. Within a preset: pipelines side by side continue as one pipeline, of as many
stages or of others; HSDP continues as FSDP on fewer shards (DCP reshards). Across presets: a pipeline's stages
continue under ddp, FSDP's shards on one device, ddp's whole model as a pipeline's stages (runtime/checkpoint_forms.py:
every checkpoint names each parameter and its optimizer state as one device does, whatever the layout). The data
position counts global batches, so it does not depend on the layout either. (Another tensor-parallel size is
refused in one line: test_resume.py.)"""

import pytest
from conftest import QUICK, TOLERANCE, make_runner
from engine_specific import launcher_of

# Shuffled, so the data position matters; a checkpoint every 2 steps. A constant learning rate: a schedule spans
# trainer.max_steps, which changes between the two starts (4, then 8). An epoch of 16 steps: trainer.max_steps, not
# the epoch's end, stops the continued training (Lightning's pipeline counted its steps apart from the other presets,
# which then trained past it).
SETTINGS = [*QUICK, "trainer.accelerator=cpu", "data.shuffle=true", "data.train_size=1024", "data.batch_size=64",
            "checkpoint.every_n_steps=2", "scheduler=constant"]  # fmt: skip
STEPS = 8
GPT = ["model=gpt", "data.vocab_size=32", "data.seq_len=16", "model.net.dim=16", "model.net.num_heads=2"]


# (name, the first start's layout, the layout it continues on).
CHANGES = [
    # 2 pipelines x 2 stages -> 1 pipeline of 2 stages.
    ("pipelines-2x2-to-1x2", ["strategy=pipeline", "trainer.devices=4", "strategy.data_parallel_size=2"],
     ["strategy=pipeline", "trainer.devices=2"]),
    # 2 pipelines x 2 stages -> 1 pipeline of 4 stages: every stage's parameters come from other stages' parts. Under
    # gpipe, whose gradients are averaged after the step (DDP's reducer failed an internal assert at the second step).
    ("pipelines-2x2-to-1x4", ["strategy=pipeline", "trainer.devices=4", "strategy.data_parallel_size=2",
                              "strategy.schedule=gpipe"],
     ["strategy=pipeline", "trainer.devices=4"]),
    # HSDP, 2 replicas x 2 shards -> FSDP over 2 shards: DCP reshards the net and the optimizer state.
    ("hsdp-2x2-to-fsdp-2", ["strategy=fsdp", "trainer.devices=4", "strategy.replicas=2"],
     ["strategy=fsdp", "trainer.devices=2"]),
    # Another preset: a pipeline's stages -> ddp's replicas of the whole model. The GPT: its head tied to the
    # embedding, each held by another stage, one parameter in the whole model (which Accelerate writes under one name).
    ("gpt-pipeline-2-to-ddp-2", [*GPT, "strategy=pipeline", "trainer.devices=2"],
     [*GPT, "strategy=ddp", "trainer.devices=2"]),
    # FSDP's shards -> one device.
    ("fsdp-2-to-single", ["strategy=fsdp", "trainer.devices=2"], ["strategy=single"]),
    # ddp's whole model -> a pipeline's stages, each taking its part (the last stage its head, saved as the embedding).
    ("gpt-ddp-2-to-pipeline-2", [*GPT, "strategy=ddp", "trainer.devices=2"],
     [*GPT, "strategy=pipeline", "trainer.devices=2"]),
    # The GPT, its head tied to the embedding: FSDP keeps the pair's optimizer state under the embedding's name alone,
    # where the last stage looks for its head's. Continued under zbv: 2 processes x 2 stages in a V, process 0 runs
    # the first stage and the last, both uses of the tied matrix.
    ("gpt-fsdp-2-to-pipeline-zbv", [*GPT, "strategy=fsdp", "trainer.devices=2"],
     [*GPT, "strategy=pipeline", "trainer.devices=2", "strategy.schedule=zbv"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, train_env):
    """uninterrupted(model) -> the per-step losses of the whole training of `model` (overrides) on one device."""
    train, losses = make_runner(tmp_path_factory.mktemp("uninterrupted"), train_env), {}

    def of(model: list[str]) -> list[float]:
        if tuple(model) not in losses:
            losses[tuple(model)] = train(*SETTINGS, *model, f"trainer.max_steps={STEPS}", "strategy=single").losses(
                STEPS
            )
            assert len(losses[tuple(model)]) == STEPS
        return losses[tuple(model)]

    return of


def launched(layout: list[str]) -> dict[str, object]:
    """How a layout's processes are started: the launcher its preset needs for its number of processes."""
    preset = next(o for o in layout if o.startswith("strategy=")).removeprefix("strategy=")
    devices = next((o for o in layout if o.startswith("trainer.devices=")), "trainer.devices=1")
    return {"launcher": launcher_of(preset, int(devices.partition("=")[2]))}


@pytest.mark.slow
@pytest.mark.parametrize("name, before, after", CHANGES, ids=[name for name, *_ in CHANGES])
def test_a_stopped_training_continues_exactly_on_another_layout(
    tmp_path, train_env, uninterrupted, name, before, after
):
    train, run_dir = make_runner(tmp_path, train_env), tmp_path / name
    single = uninterrupted([override for override in before if not override.startswith(("strategy", "trainer."))])
    first = train(*SETTINGS, "trainer.max_steps=4", *before, run_dir=run_dir, **launched(before))
    assert first.losses(STEPS) == pytest.approx(single[:4], abs=TOLERANCE)
    # The same run folder: resumes from step 4, on the other layout.
    again = train(*SETTINGS, f"trainer.max_steps={STEPS}", *after, run_dir=run_dir, **launched(after))
    assert "resuming from" in again.output
    assert "with manual optimization" not in first.output, "Lightning's warning about its pipeline's checkpoints"
    assert again.losses(STEPS + 1) == pytest.approx(single, abs=TOLERANCE)  # one wandb run, each step once
