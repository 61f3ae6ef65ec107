"""Shared helpers: run a real training as a subprocess and read back what it wrote.

Trainings run in subprocesses because Lightning's ddp launcher re-executes sys.argv for the
other ranks; inside pytest that would re-run pytest.
"""

import contextlib
import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from engine_specific import MAIN_PORTS, QUIET
from forked import ForkedCommand, NotForked, can_fork, kill_with_descendants, start_module
from omegaconf import OmegaConf
from slurm_jobs import node_to_myself, slurm_missing
from torch.distributed.checkpoint import FileSystemReader
from wandb_records import OfflineRun, offline_runs

# One thread per process unless OMP_NUM_THREADS says otherwise: the tests run several trainings at a time (two test
# files at once, presets of 2 to 4 processes), and a process taking every core (torch's default) spins OpenMP threads
# on the cores the others need. Measured on a 2-core machine under that load: a 3-step training took 1.7 to 3.7 s of
# CPU with 2 threads, 0.6 s with one. train_env hands it to the trainings.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

PACKAGE = "{{ cookiecutter.package_name }}"
# Small and fast: a few steps, no progress bar, no test pass unless a test asks for it.
QUICK = [
    "trainer.max_epochs=1",
    "trainer.log_every_n_steps=1",
    "test_after_fit=false",
    *QUIET,
]


def unsplit_net() -> list[str]:
    """Overrides that make model.net an nn.Sequential: a net that does not say how to split it."""
    net = OmegaConf.load(Path(__file__).parents[1] / "src" / PACKAGE / "configs" / "model" / "classifier.yaml").net
    return ["model.net._target_=torch.nn.Sequential", *(f"~model.net.{key}" for key in net if key != "_target_")]


@dataclass
class Run:
    returncode: int
    output: str
    run_dir: Path

    @property
    def wandb(self) -> OfflineRun:
        runs = offline_runs(self.run_dir)
        assert len(runs) == 1, f"expected one wandb run in {self.run_dir}, found {len(runs)}"
        return runs[0]

    def losses(self, k: int) -> list[float]:
        return self.wandb.metric("train/loss")[:k]

    def assert_rejected(self, message: str, in_existing_run: bool = False) -> None:
        """Bad input: exit 2 with `message` as the one `error:` line, no traceback, no run folder left behind
        (`in_existing_run`: refused in the folder of an earlier training, which stays)."""
        assert self.returncode == 2, self.output[-3000:]
        assert message in self.output
        assert "Traceback" not in self.output
        errors = [line for line in self.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and message in errors[0], errors
        if not in_existing_run:
            assert not self.run_dir.exists(), "a rejected run must not leave a folder behind"


@pytest.fixture(scope="session")
def train_env(tmp_path_factory) -> dict[str, str]:
    """Offline wandb with every wandb folder in a temp dir; no network, no account."""
    home = tmp_path_factory.mktemp("wandb-home")
    env = dict(os.environ)
    env.update(
        WANDB_MODE="offline",
        WANDB_DIR=str(home),
        WANDB_CACHE_DIR=str(home / "cache"),
        WANDB_CONFIG_DIR=str(home / "config"),
        WANDB_DATA_DIR=str(home / "data"),
        WANDB_SILENT="true",
        # wandb's own records of the machine, its system metrics and the installed packages, which no test reads:
        # 0.2-0.3 s of CPU less per training (measured, wandb 0.31; CI time)
        WANDB__SAVE_REQUIREMENTS="false",
        WANDB__DISABLE_STATS="true",
        WANDB__DISABLE_META="true",
        WANDB__DISABLE_MACHINE_INFO="true",
        PYTHONUNBUFFERED="1",
    )
    env.pop("WANDB_API_KEY", None)
    tests = Path(__file__).resolve().parent  # importable by trainings too, for test-only callbacks
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tests.parent / "src"), str(tests), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def slurm(tmp_path, tmp_path_factory):
    """The SLURM node for this test alone (skipped where SLURM does not answer); its jobs cancelled afterwards."""
    if reason := slurm_missing():
        pytest.skip(reason)
    shared = tmp_path_factory.getbasetemp().parent  # one folder for every pytest-xdist worker of this session
    with node_to_myself(shared / "slurm.lock", tmp_path):
        yield


_RUNS = itertools.count()


def next_main_port() -> int:
    """A port for the process group of a training started without a launcher. Left to themselves, Lightning (ddp,
    ddp_spawn) and accelerate's ddp_spawn pick a free port and bind it seconds later, when another test's process may
    have taken it (EADDRINUSE: seen once in a CI run). These lie below the kernel's ephemeral ports, a block of 1000
    per engine (MAIN_PORTS) and pytest-xdist worker, each used once in a test session."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    return MAIN_PORTS + 1000 * worker + next(_RUNS) % 1000


def make_runner(base_dir: Path, base_env: dict[str, str]):
    """runner(*overrides, launcher=None, check=True, env=None, run_dir=None, as_baked=False) -> Run, each run in a
    new folder of base_dir, or in `run_dir` (a restart of the training there).

    `env` changes the environment of that run only; a None value removes the variable. Overrides that name no
    strategy preset run strategy=single (as_single), unless `as_baked`: the project's default preset.
    """
    counter = iter(range(1000))

    def run(
        *overrides: str,
        launcher: list[str] | None = None,
        check: bool = True,
        timeout: int = 300,
        env: dict[str, str | None] | None = None,
        run_dir: Path | None = None,
        as_baked: bool = False,
    ) -> Run:
        run_dir = run_dir or base_dir / f"run{next(counter)}"
        overrides = list(overrides) if as_baked else as_single(list(overrides))
        command = (launcher or [sys.executable, "-m"]) + [f"{PACKAGE}.train", f"hydra.run.dir={run_dir}", *overrides]
        run_env = {**base_env, **(env or {})}
        run_env = {name: value for name, value in run_env.items() if value is not None}
        if launcher is None:  # (a launcher, torchrun or accelerate launch, hands its processes a port itself)
            run_env.setdefault("MASTER_PORT", str(next_main_port()))
        # CI time: no new interpreter importing everything again (the training's, or its launcher's and each of
        # the processes it starts) where a fork is the same process (forked.py)
        outputs = base_dir.with_name(f"{base_dir.name}-output")  # beside base_dir: tests list what is in it
        proc = None
        if command[:2] == [sys.executable, "-m"] and can_fork(run_env):
            outputs.mkdir(exist_ok=True)
            output_file = outputs / f"{run_dir.name}.log"
            with contextlib.suppress(NotForked):  # the run sets what torch reads on import (TORCH_LOGS, say)
                proc = ForkedCommand(command[2], command[3:], run_env, base_dir, output_file, f"{PACKAGE}.train")
        if proc is not None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_with_descendants(proc)
                raise
            output = proc.output()
        else:
            pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            proc = subprocess.Popen(command, env=run_env, cwd=base_dir, **pipes)
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_with_descendants(proc)
                raise
            output = stdout + stderr
        if check:
            assert proc.returncode == 0, f"{' '.join(command)} failed:\n{output[-4000:]}"
        return Run(proc.returncode, output, run_dir)

    return run


# Command-line mistakes both engines refuse alike, each in one line before anything is written: id -> (overrides,
# the line), in each engine's test_config.py table (BAD_INPUT_BY_ID). The ids sit beside their rows: kept in a list
# apart, they slipped out of line with the rows once.
COMMAND_LINE_REFUSALS_BY_ID = {
    "data-setting-nothing-takes": (  # taken in, it was dropped without a word
        ["+data.root=/data"],
        "+data.root is not a setting the data loaders take (batch_size, collate_fn, num_workers, prefetch_factor, "
        "seed, shuffle, splits) and no setting reads it; one for your dataset's class goes under data.dataset: "
        "+data.dataset.root=...",
    ),
    "preset-of-another-command": (
        ["search=gpt"],
        "search=gpt: the search presets are for `python -m {{ cookiecutter.package_name }}.search`, not",
    ),
    "unknown-setting-like-none": (["foo=1"], "unknown setting foo"),  # not a far-fetched `did you mean oom?`
    # tracebacks, or (0 features, 1 class) a task of one label "learnt" to accuracy 1.0, exit 0
    "negative-split-size": (["data.train_size=-5"], "data.train_size=-5 must be a whole number >= 0"),
    "one-class": (["data.num_classes=1"], "data.num_classes=1 must be a whole number >= 2 (the synthetic task's)"),
    "no-features": (["data.num_features=0"], "model.net.in_features=0 (data.num_features) must be a whole number"),
    "data-seed-text": (["data.seed=abc"], "data.seed=abc must be a whole number from 0 to 4294967295"),
    "time-limit": (["+trainer.max_time.seconds=25"], "trainer.max_time.seconds is not taken: a time limit stops the"),
    "oom-recovery-given-a-value": (["oom.recovery=split"], "oom.recovery=split: oom.recovery is a group of settings"),
    "wandb-mode": (["logger.mode=banana"], "logger.mode=banana is not a wandb mode; valid: online, offline, disabled"),
    "number-for-true-or-false": (["data.shuffle=2"], "data.shuffle=2 is not true or false (the default is true)"),
    # taken in, nothing read them: a top-level key, or one the checkpoint or oom settings (read by name) do not have
    "add-a-top-level-key": (["+foo=1"], "+foo: no part of the training reads a top-level foo"),
    "add-a-checkpoint-setting": (
        ["+checkpoint.every=3"],
        "+checkpoint.every: the training reads no checkpoint.every, only the settings it has: ",
    ),
    "add-an-oom-setting": (
        ["+oom.foo=1"],
        "+oom.foo: the training reads no oom.foo, only the settings it has: batch_size_finder, find_bat",
    ),
    "an-oom-setting-it-does-not-have": (
        ["oom.foo=1"],
        "unknown setting oom.foo: the training reads only the settings it has: batch_size_finder, find_b",
    ),
    "add-a-top-level-node": (["+foo.bar=1"], "+foo.bar: no part of the training reads a top-level foo"),  # (a node foo)
    # a traceback once the run folder was made: wandb.init's TypeError, the schedule's at its build
    "add-a-key-wandb-does-not-take": (
        ["+logger.tag=a"],
        "+logger.tag: wandb.init takes no tag; did you mean logger.tags? it takes ",
    ),
    # (Lightning: its WandbLogger's "got multiple values for keyword argument 'id'"; Accelerate dropped it)
    "add-a-wandb-key-the-training-sets": (
        ["+logger.id=mine"],
        "+logger.id: the training sets it itself (one wandb run per training, its restarts continuing it, with the "
        "resolved config): name the training with run_id=NAME, its wandb run with +logger.name=NAME",
    ),
    "add-a-key-the-schedule-does-not-take": (
        ["+scheduler.min_lr=0.1"],
        "scheduler: cosine() got an unexpected keyword argument 'min_lr'; drop the argument",
    ),
    "a-schedule-without-total-steps": (  # torch's own class: the training gives every schedule its total steps
        ["scheduler._target_=torch.optim.lr_scheduler.StepLR", "+scheduler.step_size=3"]
        + ["~scheduler.warmup_steps", "~scheduler.min_lr_ratio"],
        "argument 'total_steps'; the training calls it as scheduler(optimizer, total_steps=N): give a function that",
    ),
    # each value of a --multirun sweep, checked as one value is (Hydra: its own lines, exit 1, a multirun folder)
    "multirun-preset-typo": (
        ["-m", "strategy=single,ddpp"],
        "unknown strategy 'ddpp'; valid: ddp, ",
    ),  # (then presets of yours too)
    "multirun-key-typo": (
        ["-m", "trainer.max_epoch=1,2"],
        "unknown setting trainer.max_epoch; did you mean trainer.max_epochs?",
    ),
    "multirun-value-not-a-number": (
        ["-m", "model.optimizer.lr=0.1,abc"],
        "model.optimizer.lr=abc is not a number (the default is 0.001)",
    ),
    # ~ of what the training reads: a traceback (ConfigAttributeError) after the run folder was made
    "remove-a-config-group": (
        ["~trainer"],
        "~trainer: the training needs its trainer settings; choose a preset (trainer=default) or set",
    ),
    "remove-a-setting-the-training-reads": (
        ["~data.batch_size"],
        "~data.batch_size: the training reads data.batch_size; set it instead",
    ),
    # a ~ before a typo: Hydra's "Could not override", not the typo's line; a typo in a ~: "Could not delete"
    "typo-after-a-removal": (
        ["data=custom", "data.num_features=768", "data.num_classes=4", "~model.net.in_features", "model.net.width=5"],
        "unknown setting model.net.width; did you mean model.net.depth?",
    ),
    "typo-in-a-removal": (
        ["~model.net.nrom"],
        "~model.net.nrom: there is no setting model.net.nrom to remove; did you mean model.net.norm?",
    ),
    "removal-before-what-it-reads": (
        ["data=custom", "~model.net.in_features", "data.num_features=4", "data.num_classes=3"],
        "~model.net.in_features reads data.num_features, which is not set yet at that point of the command line: give",
    ),
    "argument-the-net-does-not-take": (
        ["+model.net.dropuot=0.1"],
        "argument 'dropuot'; it takes in_features, num_classes, hidden, depth, expansion",
    ),
    "a-net-of-no-blocks": (
        ["model.net.depth=0"],
        "model.net.depth=0 must be a whole number >= 1",
    ),  # trained a net of no blocks
    "remove-a-null-setting": (
        ["logger.entity=null", "~logger.entity"],
        "~logger.entity: logger.entity is null, which Hydra cannot remove; leave it as it is",
    ),
    "add-a-key-that-exists": (
        ["+trainer.max_epochs=2"],
        "+trainer.max_epochs: trainer.max_epochs exists; set it without +: trainer.max_epochs=2",
    ),
    "dataset-whose-files-are-not-there": (  # a traceback, and an empty run folder left behind
        ["data=custom", "data.dataset._target_=custom_dataset.Saved", "+data.dataset.root=nowhere"]
        + ["data.num_features=4", "data.num_classes=2"],
        "data.dataset Saved(split='train', ...): FileNotFoundError: [Errno 2] No such file or directory: 'nowhere/tr",
    ),
    # a skip connection across the layer groups: on GPUs a RuntimeError at the first step, [cpu,cpu] ran it
    "layers-of-a-forward-that-skips-across-devices": (
        [
            "strategy=model_parallel",
            "strategy.mode=layers",
            "strategy.devices=[cpu,cpu]",
            "model.net._target_=own_models.LongSkip",
        ],
        "strategy.mode=layers puts LongSkip's 2 layer groups on devices one after another, but `add` in the net's own "
        "forward (between its parts) takes tensors of layer groups 0 and 1, which would be on two devices",
    ),
    "fsdp-of-a-0-dim-parameter": (  # FSDP2's ValueError in every process, after the run folder and wandb had started
        ["strategy=fsdp", "model.net._target_=own_models.LearnedTemperature"],
        "strategy=fsdp shards the parameters with torch's FSDP2, which cannot shard the 0-dim parameter temperature:",
    ),
    # DDP's RuntimeError in every process after the run folder (FSDP: a traceback of the check below); check_only
    "ddp-of-a-lazy-layer": (
        # passed it. single and dp size it at the first step.
        ["strategy=ddp", "model.net._target_=own_models.LazyFirstLayer"],
        "model.net LazyFirstLayer's embed.weight (LazyLinear) has no size until the net's first forward, and "
        "strategy=ddp takes the net before it: give the layer its sizes",
    ),
    "fsdp-of-a-lazy-layer": (
        ["strategy=fsdp", "model.net._target_=own_models.LazyFirstLayer"],
        "model.net LazyFirstLayer's embed.weight (LazyLinear) has no size until the net's first forward, and "
        "strategy=fsdp takes",
    ),
    "add-a-key-to-no-logger": (
        ["logger=none", "+logger.tags=[a]"],
        "+logger.tags: logger=none has no logger to take it; a logger of your own",
    ),
    # a typo in a ${...}: OmegaConf's traceback of 26 to 76 lines
    "interpolation-of-a-key-that-is-not-there": (
        ["model.net.hidden=${data.num_feature}"],
        "cannot be resolved: Interpolation key 'data.num_feature' not found; a",
    ),
    "interpolation-of-an-unknown-resolver": (
        ["model.net.hidden=${data_file:x,y}"],
        "Unsupported interpolation type data_file; the resolvers: data_files, ",
    ),
    # what Hydra's grammar cannot parse: its 4 lines, exit 1
    "interpolation-unquoted": (
        ["+model.net.shape=${data_files:${data.dir},sample_shape}"],
        "cannot be parsed (extraneous input '}' expecting <EOF>); an interpolation is quoted inside the shell's "
        "quotes: '+model.net.shape=\"${data_files:${data.dir},sample_shape}\"'",
    ),
    "list-unclosed": (
        ["trainer.max_steps=[1"],
        "trainer.max_steps=[1 cannot be parsed (no viable alternative at input '[1'); Hydra's",
    ),
    # a traceback (torch's manual_seed, numpy's seed) after the run folder was made; a run folder outside outputs/
    "seed-not-whole": (["seed=1.5"], "seed=1.5 must be a whole number from 0 to 4294967295 (the default is 42)"),
    "run-id-outside-the-outputs": (
        ["run_id=../escape"],
        "run_id=../escape must name one folder (outputs/<experiment>/<run_id>): no / or ..",
    ),
    # quoted empty: the run wrote into outputs/<experiment>/ itself; null: a run folder named None
    "run-id-quoted-empty": (
        ["run_id=''"],
        "run_id='' must name one folder (outputs/<experiment>/<run_id>): no / or .., not empty or null",
    ),
    "run-id-null": (
        ["run_id=null"],
        "run_id=null must name one folder (outputs/<experiment>/<run_id>): no / or .., not empty or",
    ),
    # Lightning's words: "'<=' not supported between instances of 'int' and 'str'"
    "evaluation-limit-negative": (
        ["trainer.limit_val_batches=-1"],
        "trainer.limit_val_batches=-1 must be a number of batches (0 or more) or a share from 0.0 to 1.0",
    ),
    # wandb's traceback after the run folder was made; an empty one (an unset variable) went to wandb as it was
    "wandb-project-wandb-refuses": (
        ["logger.project=team/idea"],
        "logger.project=team/idea: cannot contain characters",
    ),
    "wandb-project-empty": (
        ["logger.project="],
        "logger.project is empty: give a wandb project name, or leave it out for the default",
    ),
    # a float batch reached the DataLoader (a traceback); a list, the optimizer ("'<=' not supported ...")
    "batch-size-not-whole": (
        ["data.batch_size=12.0"],
        "data.batch_size=12.0 must be a whole number of samples (the global batch)",
    ),
    "lr-a-list": (["model.optimizer.lr=[1,2]"], "model.optimizer.lr=[1,2] is not a number (the default is 0.001)"),
    # Lightning stepped after the epoch's last micro-batch: a smaller global batch every epoch
    "epoch-limit-inside-an-optimizer-step": (
        ["trainer.limit_train_batches=5", "trainer.accumulate_grad_batches=2", "data.batch_size=64"],
        "trainer.limit_train_batches=5 makes epochs of 5 micro-batches, which trainer.accumulate_grad_batches=2 does",
    ),
    "epoch-limit-of-no-batch": (
        ["trainer.limit_train_batches=0.0001"],
        "trainer.limit_train_batches=0.0001 leaves no training batch in an epoch",
    ),
    # Lightning refused them once the wandb run was made (validation) or after the training (test); Accelerate ran one
    "validation-share-of-no-batch": (
        ["trainer.limit_val_batches=0.01"],
        "trainer.limit_val_batches=0.01 leaves none of the 4 val batches each",
    ),
    "test-share-of-no-batch": (
        ["trainer.limit_test_batches=0.1"],
        "trainer.limit_test_batches=0.1 leaves none of the 4 test batches",
    ),
    # Lightning's words named neither the setting nor what is valid
    "devices-that-are-not-a-count": (
        ["trainer.devices=two"],
        "trainer.devices=two is not a device count; valid: 1, 2, ..., or auto (or -1)",
    ),
    "a-misspelt-class": (  # a misspelt class of a module that imports: Hydra's words said the module was not a package
        ["data.dataset._target_=torch.utils.data.TensorDatset"],
        "(torch.utils.data has no TensorDatset; did you mean torch.utils.data.TensorDataset?)",
    ),
    "hydra-group-choice": (
        ["hydra/launcher=joblib"],
        "unknown hydra/launcher 'joblib'; valid: basic",
    ),  # Hydra's: ten lines, exit 1
    # regression targets log no accuracy: refused at the first validation, after an epoch of training
    "accuracy-monitor-of-a-regression": (
        ["data=custom", "data.dataset._target_=custom_dataset.Values", "+data.dataset.size=96", "data.num_classes=1"]
        + ["data.num_features=6", "data.batch_size=32", "checkpoint.monitor=val/acc"],
        "checkpoint.monitor=val/acc, but the data's targets are values (a regression), whose validation logs val/loss",
    ),
    "pipeline-with-accumulation": (  # (what the schedule cannot do, refused naming the setting given)
        ["strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.accumulate_grad_batches=2"],
        "strategy=pipeline does not take trainer.accumulate_grad_batches=2: its schedule already runs each batch as",
    ),
    "pipeline-with-clipping": (
        ["strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.gradient_clip_val=1.0"],
        "strategy=pipeline does not take trainer.gradient_clip_val=1.0: each stage holds part of the gradient",
    ),
    # lightning-hydra-template's habits: Lightning's Trainer took them and the project's own won, without a word
    "trainer-strategy": (
        ["+trainer.strategy=ddp"],
        "trainer.strategy is not set through the trainer here: the preset is strategy=<name>",
    ),
    "trainer-logger": (
        ["+trainer.logger=false"],
        "trainer.logger is not set through the trainer here: the logger is logger=wandb or",
    ),
    "trainer-callbacks": (["+trainer.callbacks=[]"], "trainer.callbacks is not set through the trainer here: "),
    "a-setting-the-strategy-preset-lacks": (  # (it said to add it with +, which was then refused)
        ["strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "strategy.tensor_parallel_size=2"],
        "unknown setting strategy.tensor_parallel_size: the strategy preset has no tensor_parallel_size; its "
        "settings: ",
    ),
    "a-bare-word": (
        ["ddp"],
        "ddp is not a setting: this command takes key=value, e.g. strategy=ddp",
    ),  # (Hydra's 4 lines, exit 1)
    "a-value-for-a-group-of-settings": (  # (Hydra's multi-line instantiation error in the training, exit 1)
        ["model.optimizer=0.1"],
        "model.optimizer=0.1: model.optimizer is a group of settings (lr, weight_decay",
    ),
    "a-dashed-option": (  # (argparse's habit: Hydra printed its usage, eight lines)
        ["--max-epochs", "2"],
        "--max-epochs is not an option of this command: its settings are key=value, e.g. trainer.max_epochs=... "
        "(--help lists them)",
    ),
    # a setting's name as a flag: Hydra's --experimental-rerun abbreviated (a traceback), or a key the trainer lacks
    "a-dashed-top-level-setting": (
        ["--experiment=x"],
        "--experiment is not an option of this command: its settings are key=value, e.g. experiment=",
    ),
    "a-dashed-setting-of-the-data": (
        ["--batch_size", "8"],
        "--batch_size is not an option of this command: its settings are key=value, e.g. data.ba",
    ),
    "empty-training-split": (  # (it offered data.batch_size=0 or less)
        ["data.train_size=0"],
        "the training split has 0 samples, fewer than one global batch (data.batch_size=256): no step would train; "
        "give more data",
    ),
    # (no launcher: Lightning trained one process, and logged nothing, as "not rank 0")
    "stray-world-size-without-a-launcher": (
        ["env:WORLD_SIZE=2", "env:RANK=1"],
        "strategy=single runs one process, but WORLD_SIZE=2 RANK=1 is set and no launcher (torchrun, accelerate "
        "launch, srun) started this one: unset WORLD_SIZE, RANK (left from another job?); for several processes, "
        "strategy=ddp trainer.devices=N without them",
    ),
    "a-sweep-without-multirun": (  # Hydra's five lines, exit 1
        ["experiment=a,b"],
        "experiment=a,b: several values train one run each with -m (--multirun); for one run give one value",
    ),
    "quoted-device-count": (  # (Lightning's engine takes it as GPU indices on a GPU)
        ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices='2'"],
        "trainer.devices='2' is text, not a device count: give trainer.devices=2",
    ),
    "a-number-read-as-text": (  # torch's comparison error, then a made-up ~model.optimizer.KEY to drop
        ["env:LR=0.01", "model.optimizer.lr=${oc.env:LR}"],
        "a setting of the wrong kind? (a number read with ${oc.env:NAME} is text: give ${oc.decode:${oc.env:NAME}})",
    ),
    "stray-rank-under-ddp-without-a-launcher": (  # (the processes waited for ever for the others of that job's layout)
        ["env:WORLD_SIZE=2", "env:RANK=1", "env:LOCAL_RANK=1", "strategy=ddp", "trainer.devices=2"],
        "WORLD_SIZE=2 RANK=1 is set, but no launcher (torchrun, accelerate launch, srun) started this process: left "
        "from another job? unset RANK LOCAL_RANK WORLD_SIZE",
    ),
    "unknown-wandb-mode": (  # (wandb's refusal: a traceback after the run folder was made)
        ["env:WANDB_MODE=offlinee"],
        "WANDB_MODE=offlinee is not a wandb mode; valid: online, offline, disabled (or leave it unset: online when "
        "logged in, else offline)",
    ),
    "wandb-online-without-login": (  # (wandb's UsageError traceback, config.yaml left in the run folder)
        ["env:WANDB_MODE=online", "env:WANDB_API_KEY=", "env:WANDB_IDENTITY_TOKEN_FILE=", "env:NETRC=/nowhere/.netrc"],
        "WANDB_MODE=online needs a wandb login and there is none here (WANDB_API_KEY, or ~/.netrc from `wandb login`): "
        "log in, or leave WANDB_MODE unset to log offline (wandb sync uploads it later)",
    ),
    "single-on-two-nodes": (  # (it trained one process, in one engine)
        ["trainer.num_nodes=2"],
        "strategy=single runs one device but trainer.devices=1 x trainer.num_nodes=2 asks for 2; use strategy=ddp for "
        "several",
    ),
    "ddp-on-two-nodes-without-a-launcher": (  # (Lightning waited for the second node for ever)
        ["strategy=ddp", "trainer.devices=2", "trainer.num_nodes=2"],
        "trainer.num_nodes=2: this command starts the processes of one machine; for several, start torchrun on each "
        "(launch/torchrun_multinode.sh, docs/many-machines.md), or sbatch launch/slurm.sbatch",
    ),
    # The OOM toolkit (configs/oom/, read by both engines): a value that would have failed mid-training, a preset that
    # cannot run a part of it (a process out of memory would leave the others waiting)
    "unknown-oom": (["oom=lots"], "unknown oom 'lots'; valid: none, toolkit"),
    "a-setting-of-a-part-that-is-off": (  # (oom=none's recovery is null)
        ["oom.recovery.policy=skip"],
        "unknown setting oom.recovery.policy; oom.recovery is null (off) here; the oom presets: none, toolkit",
    ),
    "a-setting-of-a-part-turned-off": (  # (Hydra's five lines, exit code 1, told to add a +)
        ["oom=toolkit", "oom.recovery=null", "oom.recovery.policy=skip"],
        "unknown setting oom.recovery.policy; oom.recovery is null (off) here; the oom presets: none, toolkit",
    ),
    "unknown-recovery-policy": (
        ["oom=toolkit", "oom.recovery.policy=halve"],
        "oom.recovery.policy=halve is unknown; valid: skip, split",
    ),
    "finder-margin-not-a-fraction": (
        ["oom.find_batch_size=true", "oom.batch_size_finder.margin=1.5"],
        "oom.batch_size_finder.margin=1.5: give a fraction in [0, 1), e.g. 0.1",
    ),
    "finder-margin-null": (  # (None < 1: a TypeError in the middle of the search)
        ["oom.find_batch_size=true", "oom.batch_size_finder.margin=null"],
        "oom.batch_size_finder.margin=null: give a fraction in [0, 1), e.g. 0.1",
    ),
    "unknown-lr-scaling": (
        ["oom.find_batch_size=true", "oom.batch_size_finder.lr_scaling=cubic"],
        "oom.batch_size_finder.lr_scaling=cubic is unknown; valid: none, linear, sqrt",
    ),
    "recovery-with-accumulation": (
        ["oom=toolkit", "trainer.accumulate_grad_batches=2"],
        "oom.recovery runs the backward itself: use trainer.accumulate_grad_batches=1, or turn it off with "
        "oom.recovery=null",
    ),
    "recovery-under-pipeline": (
        ["strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2", "oom=toolkit"],
        "oom.recovery works under strategy=single|ddp|ddp_spawn, not strategy=pipeline (its schedule already runs "
        "each batch as strategy.microbatches micro-batches; raise that instead); turn it off with oom.recovery=null",
    ),
    "recovery-under-model-parallel": (
        ["strategy=model_parallel", "trainer.accelerator=cpu", "trainer.devices=2", "oom=toolkit"],
        "oom.recovery works under strategy=single|ddp|ddp_spawn, not strategy=model_parallel (its forward is a",
    ),
    "recovery-under-fsdp": (
        ["strategy=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "oom=toolkit"],
        "oom.recovery works under strategy=single|ddp|ddp_spawn, not strategy=fsdp (each layer's forward gathers",
    ),
    "recovery-under-dp": (
        ["strategy=dp", "trainer.accelerator=cpu", "oom=toolkit"],
        "oom.recovery works under strategy=single|ddp|ddp_spawn, not strategy=dp (its replicas run in threads",
    ),
    "finder-under-pipeline": (
        ["strategy=pipeline", "trainer.accelerator=cpu", "trainer.devices=2", "oom.find_batch_size=true"],
        "oom.find_batch_size works under strategy=single|ddp|ddp_spawn",  # (Accelerate: |dp, whose trials split)
    ),
    "token-vocabulary-below-its-branching": (  # (a ValueError's traceback)
        ["model=gpt", "data=tokens", "data.vocab_size=3"],
        "data.dataset.branching=4 must be between 1 and data.vocab_size=3: give data.dataset.branching=3 or a larger",
    ),
    "token-sequences-of-no-length": (
        ["model=gpt", "data=tokens", "data.seq_len=0"],
        "data.vocab_size=64 and data.seq_len=0 must be 1 or more",
    ),
}


# Loss parity: same seed, same data order, same GLOBAL batch; the first K train/loss values of every preset
# must equal strategy=single's within TOLERANCE (differences come only from the order of floating-point sums).
K = 6
TOLERANCE = 1e-5
PARITY = [*QUICK, f"trainer.max_steps={K}", "data.shuffle=false", "data.batch_size=64", "trainer.accelerator=cpu"]


@pytest.fixture(scope="module")
def single_losses(tmp_path_factory, train_env) -> list[float]:
    """The first K losses of strategy=single under PARITY."""
    run = make_runner(tmp_path_factory.mktemp("single"), train_env)(*PARITY, "strategy=single")
    losses = run.losses(K)
    assert len(losses) == K
    return losses


@pytest.fixture
def train(tmp_path, train_env):
    return make_runner(tmp_path, train_env)


@pytest.fixture(scope="module")
def refused(request, tmp_path_factory, train_env) -> list[Run]:
    """The test module's BAD_INPUT cases, (overrides, the one error line) each, given to the training command
    all in one process (CI time): a Run per case, in order."""
    cases = [overrides for overrides, _ in request.module.BAD_INPUT]
    return refuse_all(tmp_path_factory.mktemp("refused"), train_env, cases)


def as_single(overrides: list[str]) -> list[str]:
    """`overrides` under strategy=single where they name no preset (the default preset is the bake's answer, and the
    tests' expectations are single's); as given where they name one, or give a flag (--config-dir: its configs')."""
    named = any(item.lstrip("+~").startswith(("strategy=", "strategy@")) or item == "~strategy" for item in overrides)
    flagged = any(item.startswith("-") and item != "-m" for item in overrides)
    return overrides if named or flagged else [*overrides, "strategy=single"]  # (last: `-m` is the command's flag)


def refuse_all(base_dir: Path, env: dict[str, str], cases: list[list[str]]) -> list[Run]:
    """Each case (a list of overrides) given to the training command, all in ONE process (tests/refusals.py, forked
    as a training is: CI time), for input the training must refuse before it starts; a Run per case, each with its
    own run folder. A case that names no strategy preset is strategy=single's, whatever preset the project was
    baked with as its default (its words are single's)."""
    run_dirs = [base_dir / f"case{index}" for index in range(len(cases))]
    argvs = [[f"hydra.run.dir={run_dir}", *as_single(case)] for run_dir, case in zip(run_dirs, cases, strict=True)]
    (base_dir / "cases.json").write_text(json.dumps(argvs))
    log = base_dir / "refusals.log"
    driver = start_module("refusals", [str(base_dir / "cases.json")], env, base_dir, log, preload=f"{PACKAGE}.train")
    try:
        driver.wait(timeout=600)
    except subprocess.TimeoutExpired:
        kill_with_descendants(driver)
        raise
    output = log.read_text(errors="replace")
    parts = output.split("=== case ")[1:]
    assert len(parts) == len(cases), output[-4000:]
    runs = []
    for part, run_dir in zip(parts, run_dirs, strict=True):
        body = part.split("\n", 1)[1]  # after the "=== case N" line
        output, _, code = body.rpartition("=== exit ")
        runs.append(Run(int(code), output, run_dir))
    return runs


# The longest test files start first, so that under pytest-xdist (`-n 2 --dist loadfile`) no worker is left with
# one of them at the end while the other idles (CI time).
RUN_FIRST = ["test_resume.py", "test_search.py", "test_multinode.py", "test_presets.py", "test_train.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(RUN_FIRST)))  # stable: the rest keep their order


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`@pytest.mark.gpu(n)`: a test of the GPU check that needs n CUDA GPUs, skipped (saying so) on fewer."""
    marker = item.get_closest_marker("gpu")
    needed, here = (marker.args[0] if marker and marker.args else 0), torch.cuda.device_count()
    if here < needed:
        pytest.skip(f"needs {needed} CUDA GPU{'s' if needed > 1 else ''}; this machine has {here}")


def table_file(config: pytest.Config) -> Path:
    """The rows of the layout x precision table (test_presets.py), one JSON line each, in the session's temp folder
    that every pytest-xdist worker shares (each worker's basetemp is a folder in it): the summary prints them all."""
    basetemp = config._tmp_path_factory.getbasetemp()
    return (basetemp.parent if hasattr(config, "workerinput") else basetemp) / "layout-table.jsonl"


@pytest.fixture
def table_row(request):
    """table_row(layout=..., precision=...) -> the test's row of the table, filled in by the test (seconds, memory,
    ok), written when the test ends, passed or not."""
    rows = []

    def make(**columns) -> dict:
        rows.append({**columns, "ok": False})
        return rows[-1]

    yield make
    with table_file(request.config).open("a") as table:
        table.writelines(json.dumps(row) + "\n" for row in rows)


def pytest_terminal_summary(terminalreporter, config) -> None:
    """The layout x precision table of test_presets.py (the GPU check), when it ran, also under pytest-xdist."""
    if hasattr(config, "workerinput") or not table_file(config).is_file():
        return
    results = [json.loads(line) for line in table_file(config).read_text().splitlines()]
    write = terminalreporter.write_line
    write(f"{'layout':<26}{'precision':<12}{'ok':<5}{'s/run':>7}  peak MiB per device (CUDA) / RSS MiB per rank (CPU)")
    for row in sorted(results, key=lambda row: (row["layout"], row["precision"])):
        memory = ", ".join(f"{name} {value:.0f}" for name, value in sorted(row.get("memory", {}).items())) or "-"
        seconds = f"{row['seconds']:.1f}" if "seconds" in row else "-"
        write(f"{row['layout']:<26}{row['precision']:<12}{'yes' if row['ok'] else 'NO':<5}{seconds:>7}  {memory}")


def checkpoint_files(folder: Path, prefix: str) -> dict[str, set[str]]:
    """The entries of a torch.distributed.checkpoint folder whose names start with `prefix`, by the file that holds
    them (each process writes its own file: __<rank>_0.distcp)."""
    files: dict[str, set[str]] = {}
    for index, info in FileSystemReader(folder).read_metadata().storage_data.items():
        if index.fqn.startswith(prefix):
            files.setdefault(info.relative_path, set()).add(index.fqn)
    return files
