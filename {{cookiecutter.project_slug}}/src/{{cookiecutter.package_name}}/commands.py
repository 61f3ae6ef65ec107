"""The command line that trains a preset on a number of devices (and nodes) in this project's engine.

The doctor prints it as its recommendation; `bench scaling` runs it. One place, so the two never disagree
with each other or with the presets' headers.
"""

PACKAGE = "{{ cookiecutter.package_name }}"
MULTI_NODE = ["--rdzv-backend=c10d", "--rdzv-endpoint=$HEAD_NODE:29500", "--rdzv-id=$JOB_ID"]


def train_command(
    preset: str, devices: int, nodes: int = 1, overrides: list[str] | tuple[str, ...] = (), module: str = "train"
) -> list[str]:
    """`python -m <pkg>.<module> strategy=<preset> ...` with the launcher the preset needs; `devices` per node."""
    target = ["-m", f"{PACKAGE}.{module}", f"strategy={preset}"]
    if nodes > 1:  # one torchrun per node, the same line on each (same --rdzv-id: one run folder)
        torchrun = ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={devices}", *MULTI_NODE]
{%- if cookiecutter.engine == "lightning" %}
        return [*torchrun, *target, f"trainer.devices={devices}", f"trainer.num_nodes={nodes}", *overrides]
    if preset == "single":
        return ["python", *target, *overrides]
    # Lightning starts the other processes itself.
    return ["python", *target, f"trainer.devices={devices}", *overrides]
{%- else %}
        return [*torchrun, *target, *overrides]
    if preset == "single":
        return ["python", *target, *overrides]
    if preset in ("dp", "ddp_spawn"):  # one process that splits the batch, or starts the others itself
        return ["python", *target, f"trainer.devices={devices}", *overrides]
    launch = ["accelerate", "launch", "--config_file", "launch/multi_process.yaml", "--num_processes", str(devices)]
    return [*launch, *target, *overrides]
{%- endif %}
