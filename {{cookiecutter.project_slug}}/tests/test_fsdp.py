"""strategy=fsdp: FSDP2 over every process trains as one device does, and a training of it killed mid-run
continues exactly from its sharded checkpoint (the same command again, in the same run folder); the options it has
and model_parallel lacks (HSDP, offload, reshard_after_forward) run in tests/layouts.py's fsdp-hsdp row; bad settings
are refused in one line before training."""

import pytest
import torch
import torch.distributed as dist
from conftest import QUICK, TOLERANCE, make_runner
from engine_specific import LAST, launcher_of
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.testing._internal.distributed.fake_pg import FakeStore  # torch's one-process stand-in for N ranks

from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.mlp import ResidualMLP
from {{ cookiecutter.package_name }}.parallel.sharding import FsdpSettings, check_fsdp, parallelize
from {{ cookiecutter.package_name }}.runtime.checkpoint_forms import saved_entries

# Shuffled; 8 steps, a checkpoint every 3.
SETTINGS = [*QUICK, "trainer.accelerator=cpu", "data.shuffle=true", "data.train_size=512", "data.batch_size=64",
            "trainer.max_steps=8", "checkpoint.every_n_steps=3"]  # fmt: skip
STEPS = 8


def test_replicas_that_do_not_divide_the_processes_and_batchnorm_are_refused():
    net = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2)
    check_fsdp(net, 4, FsdpSettings(replicas=2))
    with pytest.raises(ConfigError, match="strategy.replicas=3 must divide the 4 processes: .* valid: 1, 2, 4"):
        check_fsdp(net, 4, FsdpSettings(replicas=3))
    batchnorm = ResidualMLP(in_features=8, num_classes=3, hidden=16, depth=2, norm="batch")
    with pytest.raises(ConfigError, match="strategy=fsdp does not synchronise BatchNorm statistics"):
        check_fsdp(batchnorm, 2, FsdpSettings())


def test_hsdp_with_tensor_parallelism_is_one_mesh_of_three_factors():
    """model_parallel with strategy.replicas=2 on 8 processes (data_parallel_size=4 x tensor_parallel_size=2): each
    block's sharded weight is replicated over 2 groups, sharded by FSDP2 over 2 within each, and split by its
    tensor-parallel plan over 2, on one mesh whose ranks are model_parallel's (torch's fake process group: one
    process stands in for the 8; parity: layouts.py's model_parallel-hsdp2xtp2, test_gpt.py's 2 x 2 x 2)."""
    dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("data_parallel", "tensor_parallel"))
        net = ResidualMLP(32, 8, hidden=16, depth=2)
        full = net.blocks[0].fc_in.weight.shape
        parallelize(net, mesh, fsdp=FsdpSettings(replicas=2))
        weight = net.blocks[0].fc_in.weight
        assert weight.device_mesh.mesh_dim_names == ("replicate", "shard", "tensor_parallel")
        assert weight.device_mesh.mesh.tolist() == mesh.mesh.view(2, 2, 2).tolist()  # the same ranks where they were
        replicated, *sharded = weight.placements  # FSDP2's shard of a tensor-parallel shard: a strided one
        assert replicated == Replicate() and all(getattr(p, "dim", None) == 0 for p in sharded), weight.placements
        assert weight.to_local().shape == (full[0] // 4, full[1])
    finally:
        dist.destroy_process_group()
    with pytest.raises(ConfigError, match="strategy.replicas=3 must divide strategy.data_parallel_size=4 .* "
                       "strategy.tensor_parallel_size=2.* valid: 1, 2, 4"):  # fmt: skip
        FsdpSettings(replicas=3).check(4, 2)


@pytest.mark.slow
def test_a_stopped_fsdp_training_continues_exactly_from_its_shards(tmp_path, train_env):
    train = make_runner(tmp_path, train_env)
    single = train(*SETTINGS, "strategy=single").losses(STEPS)
    assert len(single) == STEPS
    # One process without a launcher (python -m): FSDP2 over a group of that one, as offload on one GPU needs.
    one = train(*SETTINGS, "strategy=fsdp", "trainer.devices=1")
    assert one.losses(STEPS) == pytest.approx(single, abs=TOLERANCE)
    assert "note: strategy=fsdp runs 1 process here" in one.output and "nothing is sharded" in one.output
    # The other presets of several processes, given none (devices=auto: one on the CPU), train as single does in both
    # engines, said in a note (the Accelerate engine refused ddp, ddp_spawn and model_parallel, Lightning trained them).
    for preset in ("ddp", "ddp_spawn", "model_parallel"):
        alone = train(*SETTINGS, f"strategy={preset}")
        assert alone.losses(STEPS) == pytest.approx(single, abs=TOLERANCE), preset
        assert f"note: strategy={preset} runs 1 process here" in alone.output, alone.output[-2000:]

    # Every process killed in the forward of step 7, right after the checkpoint of step 6. The net has a head its
    # forward leaves out: AdamW keeps no state for it, which neither the continued run nor the test pass after it (the
    # best checkpoint loaded into the trained optimizer) may ask the checkpoint for, or make up.
    net = ["model.net._target_=own_models.InterruptedOnceWithUnusedHead", f"+model.net.marker={tmp_path / 'once'}",
           "+model.net.at=6", "+model.net.signal_name=SIGKILL"]  # fmt: skip
    command = [*SETTINGS, *net, "strategy=fsdp", "trainer.devices=2", "test_after_fit=true"]
    run_dir, launcher = tmp_path / "fsdp", launcher_of("fsdp", 2)
    killed = train(*command, launcher=launcher, run_dir=run_dir, check=False)
    assert killed.returncode != 0 and (run_dir / LAST).exists(), killed.output[-3000:]
    again = train(*command, launcher=launcher, run_dir=run_dir)  # the same command again: resumes from its shards
    assert "resuming from" in again.output
    assert killed.losses(STEPS + 1) == pytest.approx(single, abs=TOLERANCE)  # in one wandb run, each step once
    assert "test/loss" in again.output
    # The last checkpoint, of the continued run: the head's weights, and no optimizer state (zeros) for it.
    unused = [key for key in saved_entries(next((run_dir / LAST).rglob(".metadata")).parent) if "auxiliary" in key]
    assert len(unused) == 2 and not any(".state." in key for key in unused), unused

    trained = load_trained(run_dir / LAST)  # the shards, put together on one device
    assert trained(torch.randn(4, 32)).shape == (4, 8)  # data=synthetic: 32 features, 8 classes
