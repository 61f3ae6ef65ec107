"""Baking: every combination of choices yields exactly the expected files, fully rendered, quickly."""

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import CHOICES, TEMPLATE, every_choice

COMBINATIONS = list(every_choice())


PRESETS = ("ddp", "ddp_spawn", "dp", "fsdp", "model_parallel", "pipeline", "single")


def expected_files(package: str, engine: str) -> set[str]:
    """The exact file set of a baked project (extend it when the template gains a file). The two engines' projects
    differ only in engine/, the engine's configs, its launch files and its tests."""
    shared = {
        ".github/workflows/ci.yml",
        ".gitignore",
        ".pre-commit-config.yaml",
        "README.md",
        "docs/doctor-and-bench.md",
        "docs/gpus.md",
        "docs/language-model.md",
        "docs/many-machines.md",
        "docs/optimisation.md",
        "docs/out-of-memory.md",
        "docs/outputs.md",
        "docs/search.md",
        "docs/strategies.md",
        "docs/tests.md",
        "docs/wandb.md",
        "docs/your-data.md",
        "docs/your-model.md",
        "docs/scaling.png",
        "launch/slurm.sbatch",
        "launch/torchrun_multinode.sh",
        "pyproject.toml",
        f"src/{package}/__init__.py",
        f"src/{package}/bench.py",
        f"src/{package}/config/__init__.py",
        f"src/{package}/config/command_line.py",
        f"src/{package}/config/groups.py",
        f"src/{package}/config/objects.py",
        f"src/{package}/config/overrides.py",
        f"src/{package}/config/settings.py",
        f"src/{package}/configs/__init__.py",
        f"src/{package}/configs/bench.yaml",
        f"src/{package}/configs/data/custom.yaml",
        f"src/{package}/configs/data/files.yaml",
        f"src/{package}/configs/data/streaming.yaml",
        f"src/{package}/configs/data/synthetic.yaml",
        f"src/{package}/configs/data/tokens.yaml",
        f"src/{package}/configs/doctor.yaml",
        f"src/{package}/configs/logger/none.yaml",
        f"src/{package}/configs/logger/wandb.yaml",
        f"src/{package}/configs/model/causal_lm.yaml",
        f"src/{package}/configs/model/classifier.yaml",
        f"src/{package}/configs/model/gpt.yaml",
        f"src/{package}/configs/scheduler/constant.yaml",
        f"src/{package}/configs/oom/none.yaml",
        f"src/{package}/configs/oom/toolkit.yaml",
        f"src/{package}/configs/scheduler/cosine.yaml",
        f"src/{package}/configs/search/default.yaml",
        f"src/{package}/configs/search/gpt.yaml",
        f"src/{package}/configs/strategy/ddp.yaml",
        f"src/{package}/configs/strategy/ddp_spawn.yaml",
        f"src/{package}/configs/strategy/dp.yaml",
        f"src/{package}/configs/strategy/fsdp.yaml",
        f"src/{package}/configs/strategy/model_parallel.yaml",
        f"src/{package}/configs/strategy/pipeline.yaml",
        f"src/{package}/configs/strategy/single.yaml",
        f"src/{package}/configs/train.yaml",
        f"src/{package}/configs/trainer/default.yaml",
        f"src/{package}/data/__init__.py",
        f"src/{package}/data/batch_sizes.py",
        f"src/{package}/data/checks.py",
        f"src/{package}/data/files.py",
        f"src/{package}/data/loading.py",
        f"src/{package}/data/sampling.py",
        f"src/{package}/data/streaming.py",
        f"src/{package}/data/streaming_shapes.py",
        f"src/{package}/data/synthetic.py",
        f"src/{package}/data/tokens.py",
        f"src/{package}/doctor.py",
        f"src/{package}/engine/__init__.py",
        f"src/{package}/engine/checkpoints.py",
        f"src/{package}/engine/launching.py",
        f"src/{package}/engine/logger.py",
        f"src/{package}/engine/quiet.py",
        f"src/{package}/engine/strategies/__init__.py",
        f"src/{package}/engine/strategies/dp.py",
        f"src/{package}/engine/strategies/fsdp.py",
        f"src/{package}/engine/strategies/model_parallel.py",
        f"src/{package}/engine/strategies/pipeline.py",
        f"src/{package}/engine/training.py",
        f"src/{package}/errors.py",
        f"src/{package}/models/__init__.py",
        f"src/{package}/models/activation_checkpointing.py",
        f"src/{package}/models/compilation.py",
        f"src/{package}/models/float8.py",
        f"src/{package}/models/causal_lm.py",
        f"src/{package}/models/gpt.py",
        f"src/{package}/models/mlp.py",
        f"src/{package}/parallel/__init__.py",
        f"src/{package}/parallel/batchnorm.py",
        f"src/{package}/parallel/launcher.py",
        f"src/{package}/parallel/layout.py",
        f"src/{package}/parallel/pipelining.py",
        f"src/{package}/parallel/plan_values.py",
        f"src/{package}/parallel/presets.py",
        f"src/{package}/parallel/sharding.py",
        f"src/{package}/parallel/split.py",
        f"src/{package}/runtime/__init__.py",
        f"src/{package}/runtime/async_saves.py",
        f"src/{package}/runtime/checkpoint_files.py",
        f"src/{package}/runtime/checkpoint_forms.py",
        f"src/{package}/runtime/hardware.py",
        f"src/{package}/runtime/interrupt.py",
        f"src/{package}/runtime/memory.py",
        f"src/{package}/runtime/metrics.py",
        f"src/{package}/runtime/optimization.py",
        f"src/{package}/runtime/precision.py",
        f"src/{package}/runtime/quiet_logs.py",
        f"src/{package}/runtime/real_targets.py",
        f"src/{package}/runtime/resuming.py",
        f"src/{package}/runtime/run_folder.py",
        f"src/{package}/search/__init__.py",
        f"src/{package}/search/__main__.py",
        f"src/{package}/search/guard.py",
        f"src/{package}/search/report.py",
        f"src/{package}/search/settings.py",
        f"src/{package}/search/slurm.py",
        f"src/{package}/search/space.py",
        f"src/{package}/search/trials.py",
        f"src/{package}/search/wandb_sweep.py",
        f"src/{package}/tools/__init__.py",
        f"src/{package}/tools/estimate.py",
        f"src/{package}/tools/settings.py",
        f"src/{package}/tools/steptimes.py",
        f"src/{package}/tracking/__init__.py",
        f"src/{package}/tracking/epoch_metrics.py",
        f"src/{package}/tracking/metrics_file.py",
        f"src/{package}/tracking/wandb_files.py",
        f"src/{package}/tracking/wandb_run.py",
        f"src/{package}/train.py",
        "tests/conftest.py",
        "tests/custom_dataset.py",
        "tests/engine_specific.py",
        "tests/fake_nvml.py",
        "tests/forked.py",
        "tests/hard_kill.py",
        "tests/layouts.py",
        "tests/own_models.py",
        "tests/old_layout_run/config.yaml",
        "tests/refusals.py",
        "tests/simulated_oom.py",
        "tests/slurm_jobs.py",
        "tests/slow_start.py",
        "tests/test_activation_checkpointing.py",
        "tests/test_async_checkpoints.py",
        "tests/test_bench.py",
        "tests/test_checkpoint_forms.py",
        "tests/test_compile.py",
        "tests/test_config.py",
        "tests/test_data.py",
        "tests/test_doctor.py",
        "tests/test_dependencies.py",
        "tests/test_dp.py",
        "tests/test_files_data.py",
        "tests/test_float8.py",
        "tests/test_fsdp.py",
        "tests/test_causal_lm.py",
        "tests/test_gpt.py",
        "tests/test_gpu_paths.py",
        "tests/test_stops.py",
        "tests/test_launcher.py",
        "tests/test_layout.py",
        "tests/test_model_parallel.py",
        "tests/test_model_split.py",
        "tests/test_old_layout.py",
        "tests/test_oom.py",
        "tests/test_optimization.py",
        "tests/test_parity.py",
        "tests/test_pipelining.py",
        "tests/test_presets.py",
        "tests/test_quiet_console.py",
        "tests/test_resume.py",
        "tests/test_resume_layouts.py",
        "tests/test_resuming.py",
        "tests/test_search.py",
        "tests/test_streaming.py",
        "tests/test_tracking.py",
        "tests/test_train.py",
        "tests/test_walkthrough.py",
        "tests/wandb_records.py",
    }
    if engine == "accelerate":
        return shared | {
            "launch/multi_process.yaml",
            f"src/{package}/engine/evaluation.py",
            f"src/{package}/engine/loop.py",
            f"src/{package}/engine/oom/__init__.py",
            f"src/{package}/engine/oom/batch_size_finder.py",
            f"src/{package}/engine/oom/device_memory.py",
            f"src/{package}/engine/oom/recovery.py",
            f"src/{package}/engine/strategies/ddp.py",
            f"src/{package}/engine/torchrun.py",
            f"src/{package}/engine/torchrun_main.py",
            "tests/launchers.py",
            "tests/nets.py",
            "tests/old_layout_run/checkpoints/step-0000003/custom_checkpoint_0.pkl",
            "tests/old_layout_run/checkpoints/step-0000003/custom_checkpoint_1.pkl",
            "tests/old_layout_run/checkpoints/step-0000003/model.safetensors",
            "tests/old_layout_run/checkpoints/step-0000003/optimizer.bin",
            "tests/old_layout_run/checkpoints/step-0000003/random_states_0.pkl",
            "tests/restarts.py",
            "tests/test_multinode.py",
        }
    return shared | {
        f"src/{package}/engine/strategies/sharded_checkpoints.py",
        f"src/{package}/engine/strategies/spawn.py",
        f"src/{package}/configs/callbacks/checkpoint.yaml",
        f"src/{package}/configs/callbacks/default.yaml",
        f"src/{package}/configs/callbacks/none.yaml",
        f"src/{package}/configs/callbacks/progress_bar.yaml",
        f"src/{package}/engine/callbacks/__init__.py",
        f"src/{package}/engine/callbacks/batch_size_finder.py",
        f"src/{package}/engine/callbacks/device_memory.py",
        f"src/{package}/engine/callbacks/epoch_metrics.py",
        f"src/{package}/engine/callbacks/item_logger.py",
        f"src/{package}/engine/callbacks/oom_recovery.py",
        f"src/{package}/engine/callbacks/oom_toolkit.py",
        f"src/{package}/engine/callbacks/progress_bar.py",
        f"src/{package}/engine/datamodule.py",
        f"src/{package}/engine/lightning_private.py",
        f"src/{package}/engine/module.py",
        f"src/{package}/engine/profiler.py",
        "tests/failing_callback.py",
        "tests/kill_switch.py",
        "tests/old_layout_run/checkpoints/last.ckpt",
        "tests/oom_sim.py",
        "tests/own_modules.py",
        "tests/shard_probe.py",
        "tests/test_bench_pipeline.py",
        "tests/test_lightning_private.py",
        "tests/test_module.py",
        "tests/test_pipeline.py",
    }


@pytest.mark.parametrize("answers", COMBINATIONS, ids=["-".join(c.values()) for c in COMBINATIONS])
def test_every_choice_bakes_the_expected_project(bake, answers):
    project = bake(project_name="Pixel Shuffler", **answers)
    assert project.name == "pixel-shuffler"
    files = {str(path.relative_to(project)) for path in project.rglob("*") if path.is_file()}
    assert files == expected_files("pixel_shuffler", answers["engine"])
    assert not (project / "_engines").exists(), "the post-gen hook removes the other engine's code"
    binary = {name for name in files if name == "docs/scaling.png" or "/checkpoints/" in name}  # copied unrendered
    for name in files - binary:
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


def test_each_preset_gives_the_same_device_count_in_both_engines():
    """Same flag, same meaning: `strategy=pipeline` alone trained 2 processes in the Lightning project and was refused
    in the Accelerate one, and `strategy=ddp` took every GPU in one and a single process in the other."""

    def devices(engine: str, preset: str) -> object:
        folder = TEMPLATE / "{{cookiecutter.project_slug}}/_engines" / engine / "src/{{cookiecutter.package_name}}"
        text = re.sub(r"\{\{.*?\}\}", "package", (folder / "configs/strategy" / f"{preset}.yaml").read_text())
        return (yaml.safe_load(text).get("trainer") or {}).get("devices", 1)

    counts = {engine: [devices(engine, preset) for preset in PRESETS] for engine in CHOICES["engine"]}
    assert counts["lightning"] == counts["accelerate"], dict(zip(PRESETS, zip(*counts.values()), strict=True))
    assert counts["lightning"][PRESETS.index("pipeline")] == 2


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
    assert compile(init, "__init__.py", "exec") and 'Net """ Two' in ast.get_docstring(ast.parse(init))
    authors = tomllib.loads((project / "pyproject.toml").read_text())["project"]["authors"]
    assert authors == [{"name": "Your Name"}], "an empty e-mail is left out, not written as an invalid one"


def test_characters_beyond_the_basic_plane_reach_the_project_whole(bake):
    """An emoji (beyond U+FFFF) in the free-text answers: tojson wrote it as two escaped halves, which TOML refuses
    (pip install failed with tomllib's traceback) and Python keeps as two unprintable halves (the docstring)."""
    answers = {"description": 'Fast 🚀 "quoted"', "author_name": "Zoë 🦊", "author_email": "zoë🦊@example.com"}
    project = bake(project_name="Rocket 🚀 Net", **answers)
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["description"] == answers["description"]
    assert meta["authors"] == [{"name": answers["author_name"], "email": answers["author_email"]}]
    docstring = ast.get_docstring(ast.parse((project / "src" / "rocket_net" / "__init__.py").read_text()))
    assert docstring == 'Rocket 🚀 Net: Fast 🚀 "quoted"' and docstring.encode()


def test_post_hook_prints_next_steps_without_prompting(cookies, capfd):
    result = cookies.bake(extra_context={"project_name": "Next Steps"})
    assert result.exit_code == 0
    out = capfd.readouterr().out
    assert f"cd {result.project_path}\n" in out and "python -m next_steps.train" in out and "pytest" in out


def test_the_next_steps_name_the_project_folder_from_where_the_bake_ran(tmp_path):
    """`-o DIR`: the project is DIR/<slug>, which the printed `cd` names (it said `cd <slug>`, a folder not there)."""
    command = [str(Path(sys.executable).with_name("cookiecutter")), "--no-input", "-o", "out/here", str(TEMPLATE)]
    env = {**os.environ, "PWD": str(tmp_path)}
    baked = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert "\n  cd out/here/scaled-trainer\n" in baked.stdout and (tmp_path / "out/here/scaled-trainer").is_dir()
