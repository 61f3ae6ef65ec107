"""model=gpt, the transformer language model: it learns its generated token data alone, and every preset computes
what one device computes with it, its tied embedding and head included (the part each preset must get right)."""

import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import PARITY, QUICK, TOLERANCE, K, checkpoint_files, make_runner
from engine_specific import LAST, MODEL, SHARDED
from layouts import command, layout

from {{ cookiecutter.package_name }}.data.checks import check_input, check_output
from {{ cookiecutter.package_name }}.data.files import FilesDataset, describe
from {{ cookiecutter.package_name }}.data.loading import Data
from {{ cookiecutter.package_name }}.data.tokens import TokenData
from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.gpt import GPT
from {{ cookiecutter.package_name }}.parallel.sharding import OnMeta, check_layer_split, check_tensor_parallel, materialize
from {{ cookiecutter.package_name }}.parallel.split import fsdp_units, tied_across_stages
from {{ cookiecutter.package_name }}.runtime.metrics import perplexity

# Tiny (CI has 2 cores): 2 heads so that tensor_parallel_size=2 divides them, 2 blocks for 2 pipeline stages.
TINY = ["model=gpt", "data.vocab_size=32", "data.seq_len=16", "model.net.dim=32", "model.net.num_heads=2",
        "model.net.depth=2", "data.train_size=512", "data.val_size=64", "data.test_size=64"]  # fmt: skip
# Adam divides each gradient by its running size, so an entry whose gradient is almost 0 moves by rounding
# differences too: the weights after K steps differ by up to 2e-5 (measured, dp2xtp2) where the losses agree to 1e-7.
WEIGHT_TOLERANCE = 1e-4
# One launch of each preset and mesh mode (test_presets.py runs the other launchers and schedules on the MLP).
# The presets that shard or cut the GPT (its heads, its tied embedding and head). The data-parallel ones run the
# model's own forward whatever the model: test_presets.py runs them with the classifier, test_causal_lm.py with a
# tied transformers LM.
# (model_parallel-hsdp2x2xtp2, 8 processes, passed here in both engines and left to GPU machines for CI time: its
# mesh is tests/test_fsdp.py's, its training over three factors the 4-process model_parallel-hsdp2xtp2 row's.)
GPT_LAYOUTS = ["model_parallel-tp2", "model_parallel-dp2xtp2", "model_parallel-layers", "pipeline-1f1b-torchrun",
               "pipeline-tp2", "pipeline-dp2xtp2"]  # fmt: skip


def on_meta(build):
    with torch.device("meta"):
        return build()


def small_gpt(**sizes) -> GPT:
    return GPT(**{"vocab_size": 32, "max_seq_len": 16, "dim": 32, "depth": 2, "num_heads": 2, **sizes})


def test_token_data_is_next_token_prediction_and_the_same_for_every_process():
    x, y = TokenData("val", vocab_size=32, seq_len=16, val_size=8, seed=3).tensors
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1]), "y is x shifted by one token"
    assert torch.equal(TokenData("val", vocab_size=32, seq_len=16, val_size=8, seed=3).tensors[0], x)


def test_token_data_costs_the_vocabulary_not_its_square():
    """A vocabulary of 2**20 (a table of its square would need 4 TiB): the chain is drawn per token, in moments."""
    x, y = TokenData("train", vocab_size=2**20, seq_len=4, train_size=8, val_size=1, test_size=1).tensors
    assert x.shape == (8, 4) and int(x.max()) < 2**20 and torch.equal(x[:, 1:], y[:, :-1])


def test_token_files_size_the_vocabulary_from_inputs_and_targets(tmp_path):
    """data=files with token sequences: an id that only starts sequences (in x, never in y) still fits the model,
    which reads their integer ids (the classifier would refuse them)."""
    x, y = TokenData("train", vocab_size=32, seq_len=16, train_size=64, seed=1).tensors
    x[0, 0] = 40  # an id no target has
    for split in ("train", "val"):
        np.savez(tmp_path / f"{split}.npz", x=x.numpy(), y=y.numpy())
    assert describe(str(tmp_path))["num_classes"] == 41 and describe(str(tmp_path))["num_features"] == 16
    check_input(small_gpt(vocab_size=41), Data(partial(FilesDataset, dir=str(tmp_path)), splits=["train", "val"]))


def test_token_files_in_uint16_with_padding_targets_are_read(tmp_path):
    """Token ids stored as uint16 (the usual for token files; a traceback: torch has no max of uint16, an embedding
    takes no narrow integers) and targets padded with -100 (refused as negative labels) train as int64 ones."""
    x, y = (tensor.clone() for tensor in TokenData("train", vocab_size=32, seq_len=16, train_size=64, seed=1).tensors)
    y[:, 12:] = -100  # shorter documents, padded (y: a view of the tokens x is, shifted)
    for split in ("train", "val"):
        np.savez(tmp_path / f"{split}.npz", x=x.numpy().astype(np.uint16), y=y.numpy())
    assert describe(str(tmp_path))["num_classes"] == int(x.max()) + 1
    data = Data(partial(FilesDataset, dir=str(tmp_path)), splits=["train", "val"])
    check_input(small_gpt(), data)
    check_output(on_meta(small_gpt), data, lambda logits, y: F.cross_entropy(logits.flatten(0, -2), y.flatten()))
    first_x, first_y = data.splits["train"][0]
    assert first_x.dtype == torch.long and torch.equal(first_x, x[0]) and torch.equal(first_y, y[0])


def test_tied_weights_survive_meta_init_and_fsdp_units():
    """A tied head keeps the embedding's values when model_parallel builds the net on the meta device, and FSDP2
    leaves the tied pair to the root unit (each parameter sharded once); pipeline stages know they share it."""
    torch.manual_seed(0)
    whole = small_gpt()
    for build in (None, small_gpt):  # strategy.init=meta (each module's reset_parameters), init=full
        torch.manual_seed(0)
        with OnMeta() as init:
            net = small_gpt()
        materialize(net, torch.device("cpu"), init.rng_state, build)
        assert net.head.weight is net.embed.tokens.weight
        for name, value in whole.state_dict().items():
            assert torch.equal(net.state_dict()[name], value), name
    assert net.embed not in fsdp_units(net) and net.head not in fsdp_units(net) and net.blocks[0] in fsdp_units(net)
    assert tied_across_stages(net, 2) == [([0, 1], {0: "embed.tokens.weight", 1: "head.weight"})]
    assert tied_across_stages(small_gpt(tie_weights=False), 2) == []


def test_splits_the_model_cannot_take_are_refused_naming_the_layer():
    with pytest.raises(ConfigError, match="blocks.0.attn has 2 attention heads, which strategy.tensor_parallel_size=4"):
        check_tensor_parallel(small_gpt(), 4)
    with pytest.raises(ConfigError, match=r"embed.tokens.weight \(tied weights\) on cpu and on meta; untie them"):
        check_layer_split(small_gpt(), [torch.device("cpu"), torch.device("meta")])
    check_layer_split(small_gpt(tie_weights=False), [torch.device("cpu"), torch.device("meta")])


@pytest.mark.slow
def test_model_gpt_alone_trains_on_its_token_data(train):
    run = train(*QUICK, *TINY, "trainer.max_epochs=2", "data.batch_size=32")
    wandb = run.wandb
    assert wandb.config["data"]["dataset"]["_target_"].endswith("tokens.TokenData"), "model=gpt picks data=tokens"
    loss, perplexity = wandb.metric("val/loss"), wandb.metric("val/perplexity")
    assert len(loss) == len(perplexity) == 2
    assert perplexity[-1] == pytest.approx(math.exp(loss[-1]), rel=1e-5), "perplexity = exp(the epoch's val/loss)"
    assert loss[-1] < loss[0] < math.log(32), "below guessing among 32 tokens, and falling"
    assert loss[-1] < math.log(32) - 0.5


def test_a_diverged_loss_has_an_infinite_perplexity_not_a_crash():
    assert perplexity(math.log(32)) == pytest.approx(32)
    assert perplexity(1e6) == math.inf  # math.exp raises OverflowError past ~709


@pytest.fixture(scope="module")
def single_gpt(tmp_path_factory, train_env):
    """strategy=single's run of the tiny GPT under PARITY: its first K losses and its weights after K steps."""
    run = make_runner(tmp_path_factory.mktemp("single-gpt"), train_env)(*PARITY, *TINY, "strategy=single")
    return run.losses(K), load_trained(run.run_dir / LAST).state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("name", GPT_LAYOUTS)
def test_every_preset_trains_the_gpt_as_one_device_does(train, single_gpt, name):
    """Same losses as one device, and the same weights after K steps (gathered from shards or stages): the tied
    embedding and head stay one parameter in effect, whether FSDP2 shards it, or two pipeline stages hold it."""
    overrides, launcher = command(layout(name))
    run = train(*PARITY, *TINY, *overrides, launcher=launcher)
    losses, weights = single_gpt
    assert run.losses(K) == pytest.approx(losses, abs=TOLERANCE), name
    assert run.wandb.config["run"]["layout"] == layout(name).expected_layout(torch.cuda.device_count())
    trained = load_trained(run.run_dir / LAST).state_dict()
    for key, value in weights.items():  # (a tied pair stepped apart would be off by ~6e-3: the summed lr of K steps)
        assert torch.allclose(trained[key], value, atol=WEIGHT_TOLERANCE), f"{name}: {key} differs from single's"
    if name.startswith("pipeline"):  # each stage wrote its own part and its own copy of the tied matrix
        files = checkpoint_files(run.run_dir / SHARDED, MODEL)
        shards = next((int(o.partition("=")[2]) for o in overrides if o.startswith("strategy.tensor_parallel")), 1)
        by_stage = [set(), set()]  # what the processes of each of the 2 stages wrote (any pipeline, any shard)
        for rank in range(layout(name).processes):
            by_stage[rank // shards % 2] |= files.get(f"__{rank}_0.distcp", set())
        assert by_stage[0].isdisjoint(by_stage[1]), "no entry written by two stages, none gathered"
        assert f"{MODEL}embed.tokens.weight" in by_stage[0] and f"{MODEL}head.weight" in by_stage[1]


# (overrides, the one error line): data the GPT cannot read, refused before training and before the run folder
BAD_INPUT = [
    (["model=gpt", "data=synthetic"], "model=gpt reads token ids (integers), but the data gives float32 samples"),
    ([*TINY, "model.net.max_seq_len=8"], "sequences of 16 tokens are longer than the model's max_seq_len=8"),
    # the other way round: token ids for the classifier, which was told to store them as float32 images
    (["data=tokens"], "x is int64, but model.net's first layer embed (Linear) takes floating-point samples: store x"),
]


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=["float-data", "too-long", "token-ids-for-a-classifier"])
def test_data_the_gpt_cannot_read_is_refused_before_training(refused, case):
    refused[case].assert_rejected(BAD_INPUT[case][1])
    if BAD_INPUT[case][0] == ["data=tokens"]:
        assert "or token ids with a model that embeds them (model=gpt" in refused[case].output
