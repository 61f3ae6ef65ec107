"""Baking: every combination of choices yields exactly the expected files, fully rendered, quickly."""

import tomllib

import pytest
from conftest import CHOICES, TEMPLATE, every_choice

COMBINATIONS = list(every_choice())


PRESETS = ("ddp", "ddp_spawn", "dp", "model_parallel", "pipeline", "single")
SEARCH_MODULES = (
    "__init__",
    "__main__",
    "epoch_metrics",
    "report",
    "settings",
    "slurm",
    "space",
    "trials",
    "wandb_sweep",
)


def expected_files(package: str, engine: str) -> set[str]:
    """The exact file set of a baked project (extend it when the template gains a file)."""
    src = f"src/{package}"
    shared = {
        ".github/workflows/ci.yml",
        ".gitignore",
        ".pre-commit-config.yaml",
        "README.md",
        "docs/scaling.png",
        "pyproject.toml",
        f"{src}/__init__.py",
        f"{src}/batchnorm.py",
        f"{src}/bench.py",
        f"{src}/checkpoints.py",
        f"{src}/commands.py",
        f"{src}/compilation.py",
        f"{src}/config.py",
        f"{src}/data.py",
        f"{src}/doctor.py",
        f"{src}/files.py",
        f"{src}/gpt.py",
        f"{src}/estimate.py",
        f"{src}/hardware.py",
        f"{src}/launcher.py",
        f"{src}/memory.py",
        f"{src}/metrics.py",
        f"{src}/model.py",
        f"{src}/model_split.py",
        f"{src}/optimization.py",
        f"{src}/pipelining.py",
        f"{src}/precision.py",
        f"{src}/sharding.py",
        f"{src}/steptimes.py",
        f"{src}/streaming.py",
        f"{src}/synthetic.py",
        f"{src}/tokens.py",
        f"{src}/resuming.py",
        f"{src}/tracking.py",
        f"{src}/train.py",
        f"{src}/wandb_files.py",
        f"{src}/strategies/__init__.py",
        f"{src}/strategies/dp.py",
        f"{src}/strategies/model_parallel.py",
        f"{src}/strategies/pipeline.py",
        f"{src}/configs/__init__.py",
        f"{src}/configs/bench.yaml",
        f"{src}/configs/doctor.yaml",
        f"{src}/configs/train.yaml",
        f"{src}/configs/search/default.yaml",
        f"{src}/configs/search/gpt.yaml",
        *(f"{src}/search/{name}.py" for name in SEARCH_MODULES),
        f"{src}/configs/data/custom.yaml",
        f"{src}/configs/data/files.yaml",
        f"{src}/configs/data/streaming.yaml",
        f"{src}/configs/data/synthetic.yaml",
        f"{src}/configs/data/tokens.yaml",
        f"{src}/configs/logger/none.yaml",
        f"{src}/configs/logger/wandb.yaml",
        f"{src}/configs/model/classifier.yaml",
        f"{src}/configs/model/gpt.yaml",
        f"{src}/configs/scheduler/constant.yaml",
        f"{src}/configs/scheduler/cosine.yaml",
        f"{src}/configs/trainer/default.yaml",
        *(f"{src}/configs/strategy/{preset}.yaml" for preset in PRESETS),
        "tests/conftest.py",
        "tests/custom_dataset.py",
        "tests/fake_nvml.py",
        "tests/forked.py",
        "tests/refusals.py",
        "tests/slurm_jobs.py",
        "tests/test_config.py",
        "tests/test_bench.py",
        "tests/test_compile.py",
        "tests/test_data.py",
        "tests/test_doctor.py",
        "tests/test_files_data.py",
        "tests/test_gpt.py",
        "tests/test_gpu_paths.py",
        "tests/layouts.py",
        "tests/test_launcher.py",
        "tests/test_oom.py",
        "tests/test_optimization.py",
        "tests/test_parity.py",
        "tests/test_model_split.py",
        "tests/test_pipelining.py",
        "tests/test_presets.py",
        "tests/test_streaming.py",
        "tests/test_walkthrough.py",
        "tests/simulated_oom.py",
        "tests/test_search.py",
        "tests/test_resuming.py",
        "tests/test_tracking.py",
        "tests/test_train.py",
        "tests/wandb_records.py",
    }
    if engine == "accelerate":
        return shared | {
            "launch/multi_process.yaml",
            "launch/slurm.sbatch",
            "launch/torchrun_multinode.sh",
            f"{src}/oom.py",
            f"{src}/wandb_tracker.py",
            f"{src}/strategies/ddp.py",
            f"{src}/configs/oom/none.yaml",
            f"{src}/configs/oom/toolkit.yaml",
            "tests/launchers.py",
            "tests/nets.py",
            "tests/restarts.py",
            "tests/test_dp.py",
            "tests/test_model_parallel.py",
            "tests/test_multinode.py",
            "tests/test_resume.py",
        }
    return shared | {
        "launch/slurm.sbatch",
        "launch/torchrun_multinode.sh",
        f"{src}/datamodule.py",
        f"{src}/module.py",
        f"{src}/profiler.py",
        f"{src}/wandb_logger.py",
        f"{src}/callbacks/__init__.py",
        f"{src}/callbacks/batch_size_finder.py",
        f"{src}/callbacks/epoch_metrics.py",
        f"{src}/callbacks/device_memory.py",
        f"{src}/callbacks/item_logger.py",
        f"{src}/callbacks/oom_recovery.py",
        f"{src}/callbacks/progress_bar.py",
        f"{src}/configs/callbacks/checkpoint.yaml",
        f"{src}/configs/callbacks/default.yaml",
        f"{src}/configs/callbacks/none.yaml",
        f"{src}/configs/callbacks/batch_size_finder.yaml",
        f"{src}/configs/callbacks/device_memory.yaml",
        f"{src}/configs/callbacks/item_logger.yaml",
        f"{src}/configs/callbacks/oom.yaml",
        f"{src}/configs/callbacks/oom_recovery.yaml",
        f"{src}/configs/callbacks/progress_bar.yaml",
        "tests/failing_callback.py",
        "tests/kill_switch.py",
        "tests/oom_sim.py",
        "tests/shard_probe.py",
        "tests/test_dp.py",
        "tests/test_model_parallel.py",
        "tests/test_module.py",
        "tests/test_pipeline.py",
        "tests/test_resume.py",
    }


@pytest.mark.parametrize("answers", COMBINATIONS, ids=["-".join(c.values()) for c in COMBINATIONS])
def test_every_choice_bakes_the_expected_project(bake, answers):
    project = bake(project_name="Pixel Shuffler", **answers)
    assert project.name == "pixel-shuffler"
    files = {str(path.relative_to(project)) for path in project.rglob("*") if path.is_file()}
    assert files == expected_files("pixel_shuffler", answers["engine"])
    assert not (project / "_engines").exists(), "the post-gen hook removes the other engine's code"
    for name in files - {"docs/scaling.png"}:  # the one binary file (cookiecutter copies it unrendered)
        text = (project / name).read_text()
        assert "{{" not in text and "{%" not in text, f"unrendered Jinja left in {name}"
        if name.endswith(".py"):
            compile(text, name, "exec")  # every generated module is valid Python
    train_yaml = (project / "src/pixel_shuffler/configs/train.yaml").read_text()
    assert f"  - strategy: {answers['default_strategy']}\n" in train_yaml
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == f">={answers['python_version']}"


@pytest.mark.parametrize("engine", CHOICES["engine"])
def test_choices_cover_every_strategy_preset(engine):
    presets = (
        TEMPLATE
        / "{{cookiecutter.project_slug}}/_engines"
        / engine
        / "src/{{cookiecutter.package_name}}/configs/strategy"
    )
    assert set(CHOICES["default_strategy"]) == {path.stem for path in presets.glob("*.yaml")} == set(PRESETS)
    assert CHOICES["default_strategy"][0] == "single", "the default must run on any machine"


def test_answers_reach_the_project(bake):
    project = bake(
        project_name="Café Net",
        description='Says "hi" {and} <leaves>',
        author_name="Ada O'Neil",
        wandb_entity="my-team",
    )
    assert project.name == "cafe-net"  # slugify transliterates to ASCII
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "cafe-net"
    assert meta["description"] == 'Says "hi" {and} <leaves>'
    assert meta["authors"][0]["name"] == "Ada O'Neil"
    logger = (project / "src/cafe_net/configs/logger/wandb.yaml").read_text()
    assert 'project: "cafe-net"' in logger and 'entity: "my-team"' in logger
    assert (project / "README.md").read_text().startswith("# Café Net")


def test_awkward_answers_still_give_valid_python_and_toml(bake):
    project = bake(project_name='Net """ Two', description="ends in C:\\New\\", author_email="")
    package = project / "src" / "net_two"
    init = (package / "__init__.py").read_text()
    assert compile(init, "__init__.py", "exec") and 'Net """ Two' in eval(init)
    authors = tomllib.loads((project / "pyproject.toml").read_text())["project"]["authors"]
    assert authors == [{"name": "Your Name"}], "an empty e-mail is left out, not written as an invalid one"


def test_post_hook_prints_next_steps_without_prompting(cookies, capfd):
    assert cookies.bake(extra_context={"project_name": "Next Steps"}).exit_code == 0
    out = capfd.readouterr().out
    assert "cd next-steps" in out and "python -m next_steps.train" in out and "pytest" in out
