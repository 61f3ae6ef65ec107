"""Where a start of a training begins, decided before anything is built: a launcher's restart continues from the
run's own last checkpoint, and a run folder's checkpoints are resumed only by the training that wrote them."""

import functools
import importlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

from ..errors import ConfigError, said_once
from ..parallel.launcher import is_first_process
from .checkpoint_files import damage, looks_like_checkpoint, saved_shapes
from .precision import precision_used

# What a run's checkpoints are made of, which the run continued in its own folder must keep: changed, a checkpoint
# cannot be loaded (the net's shapes) or not continued where it stopped (its position in the epoch counts global
# batches and micro-batches of that data, in that order). The optimizer's class: its saved state is another's (SGD's
# momentum buffers are no AdamW's), a KeyError at the first step; its settings and the schedule's: the state keeps
# the saved ones (kept_optimizer_note), which the run's config.yaml would then misreport. The seed and the data's own
# settings: the rest of the run would train on other samples (the seed generates the synthetic data) or in another
# order. And the Lightning engine's LightningModule of your own (+model._target_). Anything else may change between
# starts: more epochs, more processes, another preset (checkpoint_forms.py; but see check_same_mesh), where the data is.
MUST_MATCH = (
    "model.net",
    "model._target_",
    "model.optimizer",
    "model.no_decay_norms_and_biases",  # the optimizer's parameter groups: 2 or 1 (a zip() error at the first step)
    "data.batch_size",
    "trainer.accumulate_grad_batches",
    "scheduler",  # another schedule's saved state: a KeyError at the load, or its learning rate kept; its settings kept
    "seed",
    "data.seed",
    "data.shuffle",
    "data.dataset",
)
# Must match too, where the run's config has them (an older template's did not): the best kept so far is by the
# monitor (another made the best the best since this start, and the Accelerate engine deleted the run's)
MUST_MATCH_WHERE_SAVED = ("checkpoint.monitor",)
# Where the data is (its folder moved, a bucket mirrored) and where it is cached: the same data (the last part of a key)
MAY_MOVE = ("dir", "root", "path", "data_dir", "cache_dir", "max_cache_size")
PACKAGE = __package__.partition(".")[0]
# Where a `_target_` of a run folder saved before the package was laid out in folders (its config.yaml) lives now.
# The old module names are not kept as aliases: `data` and `tracking` are packages now, so aliases would collide.
MOVED_MODULES = {
    "batchnorm": "parallel.batchnorm",
    "callbacks": "engine.callbacks",
    "checkpoints": "engine.checkpoints",
    "compilation": "models.compilation",
    "data": "data.loading",
    "datamodule": "engine.datamodule",
    "files": "data.files",
    "gpt": "models.gpt",
    "model": "models.mlp",
    "model_split": "parallel.split",
    "module": "engine.module",
    "optimization": "runtime.optimization",
    "profiler": "engine.profiler",
    "strategies": "engine.strategies",
    "streaming": "data.streaming",
    "synthetic": "data.synthetic",
    "tokens": "data.tokens",
    "wandb_logger": "engine.logger",
    "wandb_tracker": "engine.logger",
}


# Each engine's link to a run's last checkpoint (engine/checkpoints.LAST), and that engine's name: a run folder of
# the other engine's project holds checkpoints this one cannot read.
ENGINE_LASTS = {"last.ckpt": "Lightning", "last": "Accelerate"}


def other_engines_run(run_dir: Path, last: str) -> str | None:
    """The other engine's name where `run_dir` holds its checkpoints and none of this engine's (`last`: its link)."""
    folder = run_dir / "checkpoints"
    if (folder / last).exists():
        return None
    return next((engine for name, engine in ENGINE_LASTS.items() if name != last and (folder / name).exists()), None)


def check_saved_run(path: Path, last: str) -> None:
    """ckpt_path= a run folder (its config.yaml) with no complete checkpoint yet, or with the other engine's: said
    so, where the refusal of anything else that is not a checkpoint says to give one or a run folder."""
    if (path / "config.yaml").is_file() and (engine := other_engines_run(path, last)):
        raise ConfigError(
            f"ckpt_path={path} is a run folder of a project of the {engine} engine, whose checkpoints this project "
            "cannot read: give a run folder or checkpoint of this project"
        )
    if (path / "config.yaml").is_file():
        raise ConfigError(
            f"ckpt_path={path} is a run folder without a complete checkpoint (yet): give another run's, or leave "
            "ckpt_path out"
        )


def resuming_message(last: Path) -> str:
    """What a training says when it continues from the run's last checkpoint (both engines)."""
    hint = "" if restart_count() else " (resume=false starts afresh)"  # a restart's first line said why not
    return f"resuming from {last.resolve()}{hint}"


def starting_from_message(checkpoint: Path) -> str:
    """What a training says when it starts from `ckpt_path` (both engines; Accelerate said nothing)."""
    return f"starting from {checkpoint.resolve()} (ckpt_path)"


def afresh_message(run_dir: Path) -> str:
    """What resume=false says when it overwrites an earlier training in `run_dir` (both engines)."""
    return f"resume=false: starting afresh, removing the earlier training's checkpoints in {run_dir}"


def restart_count() -> int:
    """How often a launcher has started this training again: torchrun's restarts of its processes
    (--max-restarts), SLURM's requeues of its job; 1 for a restart that torchrun's agent did not count."""
    env = os.environ
    counted = max(int(env.get("TORCHELASTIC_RESTART_COUNT", "0")), int(env.get("SLURM_RESTART_COUNT", "0")))
    return counted or int(started_before_by_this_agent())


def started_before_by_this_agent() -> bool:
    """Under torchrun: whether this machine's agent started this process's rank before. Each agent counts only the
    restarts its own processes' failure caused: when another machine's process dies, this one's are started again
    with TORCHELASTIC_RESTART_COUNT still 0, and took the restart for a first start (resume=false then wiped the
    checkpoints the other machine resumed from). The mark, the first start's process id, is kept in the agent's
    folder (torchrun's per-launch log folder, where it asks for error files), which lives as long as the agent."""
    if not (error_file := os.environ.get("TORCHELASTIC_ERROR_FILE")):
        return False
    mark = Path(error_file).parents[2] / f"started-rank{os.environ.get('LOCAL_RANK', '0')}"
    try:
        if mark.exists():
            return mark.read_text() != str(os.getpid())
        mark.write_text(str(os.getpid()))
    except OSError:  # an unexpected folder: the agent's count alone, as before
        return False
    return False


def starting_point(run_dir: Path, cfg: DictConfig, last: Path) -> tuple[str | None, bool]:
    """(ckpt_path, resume) for this start; `last` is the run's link to its last complete checkpoint.

    A launcher's restart repeats the first start's command line, so `ckpt_path=X` would go back to X and
    `resume=false` wipe what the training saved since: both apply to the first start only. A restart of a run
    that has a checkpoint continues from it (and says so in one line); one killed before its first checkpoint
    starts as the first did, in the same wandb run. So does the same command run again by hand (a stopped run says to),
    `ckpt_path=` included. A training that resumes by itself must be the one that wrote the checkpoints
    (check_same_training).
    """
    ckpt_path, resume = cfg.ckpt_path, cfg.resume
    if resume and (engine := other_engines_run(run_dir, last.name)):  # (it trained from step 0, in silence)
        raise ConfigError(
            f"{run_dir} holds checkpoints of a project of the {engine} engine, which this project cannot continue: "
            "give another run folder (run_id=NAME), or resume=false to train afresh there (removing them)"
        )
    restarts = restart_count()
    if restarts and last.exists() and (ckpt_path or not resume):
        given = f"ckpt_path={ckpt_path}" if ckpt_path else "resume=false"
        if is_first_process():
            print(f"restart {restarts}: resuming from the run's last checkpoint ({given} was for the first start only)")
        ckpt_path, resume = None, True
    elif restarts:
        resume = True  # nothing of its own to wipe, and its wandb run to continue
    if last.exists() and resume and ckpt_path:  # the command that started it, again, as "continue with" says
        if is_first_process():
            print(
                f"this run has checkpoints of its own: it continues from its last (ckpt_path={ckpt_path} was for its "
                "first start)"
            )
        ckpt_path = None
    if last.exists() and resume and not ckpt_path:
        check_same_training(run_dir, cfg)  # (the optimizer's and schedule's settings included: no note for them)
        check_whole(last.resolve(), given=False)
        notes = [
            schedule_length_note(run_dir / "config.yaml", cfg),
            changed_training_note(run_dir / "config.yaml", cfg),
        ]
    elif ckpt_path:
        check_loadable(Path(ckpt_path), cfg)
        check_whole(Path(ckpt_path).resolve(), given=True)
        saved = saved_config(Path(ckpt_path))
        notes = [schedule_length_note(saved, cfg), kept_optimizer_note(saved, cfg)]
    else:
        return ckpt_path, resume
    for note in filter(None, notes):
        if is_first_process():
            print(note)
    return ckpt_path, resume


def saved_config(checkpoint: Path) -> Path:
    """The config.yaml of the run folder a checkpoint was saved in (a path that is not there for a checkpoint outside
    a run folder, or a run folder without one: nothing to compare)."""
    run_dir = next((folder.parent for folder in checkpoint.absolute().parents if folder.name == "checkpoints"), None)
    return (run_dir or checkpoint) / "config.yaml"


# What a run continued in its own folder may change, but then trains its next steps otherwise than its first: said,
# as its config.yaml, rewritten, keeps the new value only (a template update's new default, a changed clip, a
# precision lowered after running out of memory).
CHANGES_THE_STEPS = ("trainer.gradient_clip_val", "trainer.gradient_clip_algorithm", "trainer.precision")


def changed_training_note(saved: Path, cfg: DictConfig) -> str | None:
    now = cfg.copy()  # (config.yaml holds the precision the run used: `auto` resolved, 16-mixed on the CPU bf16-mixed)
    now.trainer.precision = precision_used(cfg.trainer.precision, cfg.trainer.accelerator)
    if differ := differences(saved, now, saved_keys(saved, CHANGES_THE_STEPS)):
        return (
            f"note: {differ}: the steps from here train so, the ones before did not (config.yaml will hold the new "
            "values only); for the run's own, give its settings"
        )
    return None


def saved_keys(saved: Path, keys: tuple[str, ...]) -> tuple[str, ...]:
    """Those of `keys` the config saved at `saved` has (a setting the run's template did not have yet is no change
    of the user's)."""
    if not saved.is_file():
        return ()
    then = load_saved_config(saved)
    return tuple(key for key in keys if OmegaConf.select(then, key, default="absent") != "absent")


def kept_optimizer_note(saved: Path, cfg: DictConfig) -> str | None:
    """model.optimizer's or the schedule's settings changed for a training continued from a checkpoint (ckpt_path=):
    it trains with the checkpoint's, which its optimizer and schedule states hold (the learning rate, as the base of
    its schedule; weight decay, betas, warmup ...), and nothing said so. A note, not a refusal: a checkpoint may well
    be meant to go on as it was."""
    if differ := differences(saved, cfg, ("model.optimizer", "scheduler")):
        return (
            f"note: {differ}: a training continued from a checkpoint keeps the optimizer and schedule settings its "
            "state holds (the learning rate the schedule starts from included); for new ones, start a new training "
            "from its weights (docs/your-model.md, pretrained weights)"
        )
    return None


def check_same_training(run_dir: Path, cfg: DictConfig) -> None:
    """Refuse, in one line, to resume the checkpoints in `run_dir` with settings they cannot continue under
    (MUST_MATCH), as the run's config.yaml has them. A plain run inside a SLURM allocation (salloc) is named
    after the job: two different trainings there meet in one folder."""
    saved = run_dir / "config.yaml"
    if differ := differences(saved, cfg, MUST_MATCH + saved_keys(saved, MUST_MATCH_WHERE_SAVED), ignored=MAY_MOVE):
        raise ConfigError(
            f"{run_dir} has checkpoints of a training that differs from this one in {differ}: give "
            "resume=false to start afresh there (its checkpoints are deleted), or run_id=NAME for a new run folder"
        )


def check_not_past_the_end(
    checkpoint: Path, epochs: int, steps: int, max_epochs: int, max_steps: int, given: bool = False, tested: bool = True
) -> str | None:
    """Refuse, in one line, to continue a checkpoint that has trained past this training's end: it would train
    nothing (Lightning refuses fewer epochs itself, but only once the wandb run started). `epochs`, `steps`: the
    whole epochs and the optimizer steps it has done; -1 (or None) for a limit: none. `given`: named by ckpt_path=.
    Returns the note to print when it has trained exactly to the end: the run goes on (a job restarted after it
    finished ends at once, exit 0), with nothing to train but the test pass; or, for a checkpoint `given`, when
    it has more to train before the test, if `tested` (a user testing a checkpoint again tested other weights,
    unsaid)."""
    over = []
    if max_epochs not in (None, -1) and epochs > max_epochs:
        over.append(f"trainer.max_epochs={max_epochs}")
    if max_steps not in (None, -1) and steps > max_steps:
        over.append(f"trainer.max_steps={max_steps}")
    if over:
        raise ConfigError(
            f"{checkpoint} has trained {epochs} epoch{'s' * (epochs != 1)} ({steps} steps), past {' and '.join(over)}: "
            "to train it further give more; "
            + (
                "start from another checkpoint, or none"
                if given
                else "to train afresh give resume=false, or run_id=NAME"
            )
        )
    reached = [f"trainer.max_epochs={max_epochs}"] if max_epochs not in (None, -1) and epochs == max_epochs else []
    reached += [f"trainer.max_steps={max_steps}"] if max_steps not in (None, -1) and steps == max_steps else []
    if not reached and given and tested:  # (its test would be of other weights: testing it again is so, see docs)
        ends = " and ".join(
            f"trainer.{key}={limit}" for key, limit in (("max_epochs", max_epochs), ("max_steps", max_steps))
            if limit not in (None, -1)
        )  # fmt: skip
        return (
            f"note: {checkpoint.name} has trained {steps} steps; this run trains it on to {ends or 'no end'} before "
            f"its test: to test it as it is, give trainer.max_steps={steps}"
        )
    if not reached:
        return None
    return (
        f"note: this run has trained to {' and '.join(reached)} already ({steps} steps): nothing left to train; to "
        "train it further, raise the limit (its learning-rate schedule keeps the length it was made for)"
    )


def check_whole(checkpoint: Path, given: bool) -> None:
    """Refuse, in one line, to start from a checkpoint whose files are damaged (checkpoint_files.py), naming the run's
    newest whole one to continue from instead. `given`: named by ckpt_path= (else the run's last one). Every process
    checks; the first says it."""
    if not checkpoint.exists() or not (problem := damage(checkpoint)):
        return
    others = sorted(
        # of its kind (a .ckpt file, a folder): not a weights-only .pt beside it, which ckpt_path= refuses
        (path for path in checkpoint.parent.iterdir() if path != checkpoint and same_kind(path, checkpoint)),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )
    instead = next((path for path in others if not damage(path)), None)
    if given:
        options = f"give another checkpoint{f' (the newest whole one beside it: {instead})' if instead else ''}"
    else:
        options = f"continue from its newest whole one with ckpt_path={instead}, or " if instead else ""
        options += "start afresh with resume=false"
    what = "ckpt_path=" if given else "the run's last checkpoint "
    raise said_once(ConfigError(f"{what}{checkpoint} cannot be read: {problem}; {options}"), is_first_process())


def same_kind(path: Path, checkpoint: Path) -> bool:
    return looks_like_checkpoint(path) and (path.suffix, path.is_dir()) == (checkpoint.suffix, checkpoint.is_dir())


MESH_FILE = "mesh.json"  # in the folder of a model_parallel checkpoint's shards: the mesh they were saved on


def check_keep_last(keep_last: Any) -> None:
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ConfigError(f"checkpoint.keep_last={keep_last} keeps no checkpoint to continue from; give 1 or more")


def write_mesh(folder: Path, data_parallel: int, tensor_parallel: int, preset: str) -> None:
    """Record the preset and mesh a checkpoint's parts were saved on (first process only)."""
    if is_first_process():
        mesh = {"preset": preset, "data_parallel": data_parallel, "tensor_parallel": tensor_parallel}
        (folder / MESH_FILE).write_text(json.dumps(mesh))


def check_same_mesh(
    folder: Path | None, data_parallel: int, tensor_parallel: int, preset: str, given: bool = False
) -> None:
    """Refuse, before training, a checkpoint saved with another tensor-parallel size than this run's (tensor parallel 2
    -> FSDP or ddp, ddp -> tensor parallel 2), or with tensor parallelism under another preset or, model_parallel's,
    on another mesh. The optimizer's parameter groups follow the tensor-parallel layout (runtime/optimization.
    by_placement: one per kind of shard), and so does the learning-rate schedule's state: loaded into other groups,
    the first step fails (KeyError 'betas') or a group misses its schedule. Without tensor parallelism (every other
    preset, fsdp and HSDP included) the groups are the same on any layout and number of processes: a checkpoint resumes
    under any of them (checkpoint_forms.py; DCP reshards); so does a pipeline's on other pipelines side by side. The
    weights alone load on any layout (load_trained). A checkpoint without a recorded mesh (a whole-model file or
    folder) has no tensor parallelism; one recorded before the preset was, model_parallel's."""
    if folder is None or not folder.exists():
        return
    # `given`: named by ckpt_path=, which resume=false does not drop
    afresh = "start from another checkpoint, or none" if given else "start afresh with resume=false"
    path = folder / MESH_FILE
    saved = json.loads(path.read_text()) if path.is_file() else {"tensor_parallel": 1}
    then_preset, then_tp, then_dp = (
        saved.get("preset", "model_parallel"),
        saved["tensor_parallel"],
        saved.get("data_parallel"),
    )
    if then_tp == tensor_parallel == 1:
        return
    if then_tp == 1:
        raise ConfigError(
            f"{folder} was saved without tensor parallelism, this run's tensor-parallel size is {tensor_parallel}: its "
            "optimizer state and schedule fit one parameter group per kind of parameter only; resume it under a "
            f"preset without (strategy.tensor_parallel_size=1), or {afresh}"
        )
    if then_preset == "model_parallel" and (then_dp, then_tp) != (data_parallel, tensor_parallel):
        raise ConfigError(
            f"{folder} was saved by strategy=model_parallel on a mesh of {then_dp} data-parallel x {then_tp} "
            f"tensor-parallel processes, this run's is {data_parallel} x {tensor_parallel}: its optimizer state fits "
            f"that mesh only; resume on it (strategy=model_parallel strategy.data_parallel_size={then_dp} "
            f"strategy.tensor_parallel_size={then_tp}, {then_dp * then_tp} processes), or {afresh}"
        )
    if then_preset != preset or then_tp != tensor_parallel:
        raise ConfigError(
            f"{folder} was saved by strategy={then_preset} with strategy.tensor_parallel_size={then_tp}, this run is "
            f"strategy={preset} with {tensor_parallel}: its optimizer state fits that layout's parameter groups only; "
            f"resume it under strategy={then_preset} strategy.tensor_parallel_size={then_tp}, or {afresh}"
        )


def check_loadable(checkpoint: Path, cfg: DictConfig) -> None:
    """Refuse, in one line, an explicit `ckpt_path=` whose training (the config.yaml of the run folder it was saved
    in, if there is one) had another net, optimizer or schedule class, or other parameter groups
    (model.no_decay_norms_and_biases): loading it would fail deep inside the engine (or keep the saved schedule's
    learning rate). The batch and the accumulation may change: a checkpoint given by hand may be fine-tuned
    differently."""
    saved = saved_config(checkpoint)
    keys = ("model.net", "model.optimizer._target_", "model.no_decay_norms_and_biases", "scheduler._target_")
    if differ := differences(saved, cfg, keys):
        raise ConfigError(
            f"ckpt_path={checkpoint} was saved by a training that differs from this one in {differ}: give the "
            f"settings of {saved}, or another checkpoint"
        )


def check_same_shapes(checkpoint: Path, net: nn.Module) -> None:
    """Refuse, in one line, an explicit `ckpt_path=` that holds another net's tensors: other sizes, or few of this
    net's names (another model). A checkpoint copied out of its run folder has no config.yaml for check_loadable to
    compare, and the engine's loading failed with a traceback once the run folder and the wandb run were made. Names
    the checkpoint lacks are left to the loading: a tied weight is saved once (safetensors)."""
    expected = {
        name: tuple(tensor.shape)
        for name, tensor in net.state_dict().items()
        if not isinstance(tensor, nn.parameter.UninitializedTensorMixin)  # (a lazy layer's: no size yet)
    }
    saved = saved_shapes(checkpoint)
    # What the checkpoint puts before the net's names: "net." (Lightning), "model." (a DCP folder), or nothing
    prefixes = Counter(
        key[: len(key) - len(name)] for key in saved for name in expected if key == name or key.endswith("." + name)
    )
    prefix = prefixes.most_common(1)[0][0] if prefixes else ""
    found = sum(prefix + name in saved for name in expected)
    if saved and found < len(expected) / 2:  # (a tied weight is saved once: a name or two may be missing)
        raise ConfigError(
            f"ckpt_path={checkpoint} holds {found} of this net's {len(expected)} tensors (it has "
            f"{next(iter(saved))}, the net {next(iter(expected))}): it is another model's; give the model it was "
            "trained with (model=...), or another checkpoint"
        )
    differ = [
        f"{name}: {list(saved[prefix + name])} there, {list(shape)} here"
        for name, shape in expected.items()
        if prefix + name in saved and saved[prefix + name] != shape
    ]
    if differ:
        more = f" and {len(differ) - 2} more" if len(differ) > 2 else ""
        raise ConfigError(
            f"ckpt_path={checkpoint} holds tensors of other sizes than this net's ({'; '.join(differ[:2])}{more}): it "
            "was trained with other model settings; give those (its run's config.yaml has them), or another checkpoint"
        )


def schedule_length_note(saved: Path, cfg: DictConfig) -> str | None:
    """A training continued with another length than the one whose config is `saved`: its cosine schedule, in the
    checkpoint, keeps the span it was made for (the steps past it train at its floor), which nothing said."""
    if not str((cfg.get("scheduler") or {}).get("_target_", "")).endswith(".cosine"):
        return None
    if differ := differences(saved, cfg, ("trainer.max_steps", "trainer.max_epochs")):
        return (
            f"note: {differ}: the run's cosine schedule keeps the span it was made for (its decay ends by the old "
            "length, or a step after a warmup longer than that, and the steps after it train at its floor, lr x "
            "scheduler.min_lr_ratio); for one over the new length, train afresh (resume=false; from a checkpoint's "
            "weights: docs/your-model.md, pretrained weights)"
        )
    return None


def differences(saved: Path, cfg: DictConfig, keys: tuple[str, ...], ignored: tuple[str, ...] = ()) -> str:
    """How `cfg` differs from the config saved at `saved` in the settings under `keys` (but those named as `ignored`
    ones), in a few words ("" if alike, or if nothing was saved there)."""
    if not saved.is_file():
        return ""
    then, now = flat(load_saved_config(saved), keys), flat(cfg, keys)
    for values in (then, now):  # the Lightning engine's own module, named (an older layout) or not
        if values.get("model._target_") == f"{PACKAGE}.engine.module.Classifier":
            values["model._target_"] = None
    names = sorted(key for key in then.keys() | now.keys() if key.rpartition(".")[2] not in ignored)
    differ = [f"{key}: {then.get(key)} then, {now.get(key)} now" for key in names if then.get(key) != now.get(key)]
    if len(differ) > 4:  # another model altogether: its first few keys say enough
        differ[3:] = [f"{len(differ) - 3} more"]
    return "; ".join(differ)


def flat(cfg: DictConfig, keys: tuple[str, ...]) -> dict[str, object]:
    """The settings of `cfg` under `keys`, resolved, by dotted key."""
    values: dict[str, object] = {}
    for key in keys:
        node = OmegaConf.select(cfg, key, default=None)
        values.update(leaves(key, OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node))
    return values


def leaves(prefix: str, value: object) -> dict[str, object]:
    if isinstance(value, dict):
        return {name: leaf for key, item in value.items() for name, leaf in leaves(f"{prefix}.{key}", item).items()}
    return {prefix: value}


def trained_config(checkpoint: Path, config: str | Path | None) -> DictConfig:
    """The config a checkpoint was trained with, for load_trained: `config` if given, else the config.yaml of the run
    folder it is in (<run dir>/checkpoints/<checkpoint>). A checkpoint copied out of its run folder has none there:
    said, with how to give it (a FileNotFoundError for a config.yaml two folders up, which it never named)."""
    path = Path(config) if config else checkpoint.parent.parent / "config.yaml"
    if not path.is_file():
        where = "" if config else f" ({checkpoint} is not in its run folder's checkpoints/)"
        raise FileNotFoundError(
            f"{path} is missing{where}: give the config.yaml of the run that trained it, "
            "load_trained(checkpoint, config=PATH)"
        )
    return load_saved_config(path)


def load_saved_config(path: Path) -> DictConfig:
    """A run folder's config.yaml (resolved when it was written), its `_target_`s moved to where the classes live
    now (MOVED_MODULES): a run folder of an older layout still loads and resumes. Parsed once per version of the
    file: a resume's checks each read it."""
    stat = path.stat()
    return OmegaConf.create(_saved_container(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _saved_container(path: str, modified: int, size: int) -> dict[str, Any]:
    return upgrade_targets(OmegaConf.to_container(OmegaConf.load(path)))


def upgrade_targets(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: moved_target(value) if key == "_target_" else upgrade_targets(value) for key, value in node.items()
        }
    if isinstance(node, list):
        return [upgrade_targets(item) for item in node]
    return node


def moved_target(target: Any) -> Any:
    """`<package>.<old module>.Name` as it is called now; any other target unchanged."""
    package, _, rest = str(target).partition(".")
    if package != PACKAGE or importable(target):
        return target
    parts = rest.split(".")
    for length in range(len(parts) - 1, 0, -1):  # the longest old module name; what follows is the class
        old = ".".join(parts[:length])
        if old in MOVED_MODULES:
            return ".".join([PACKAGE, MOVED_MODULES[old], *parts[length:]])
    return target


def importable(target: str) -> bool:
    module, _, name = target.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def other_process_count_note(saved: int, processes: int) -> str:
    """What a checkpoint of `saved` processes' random states, continued on `processes`, cannot restore (both
    engines say it alike)."""
    return (
        f"the checkpoint holds the random state of {saved} processes, this run has {processes}: random numbers drawn "
        "in the training processes (dropout; not loader workers' augmentation, seeded per sample) continue from the "
        "seed instead"
    )
