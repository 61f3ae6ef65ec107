"""model=causal_lm: a Hugging Face transformers causal LM (a Llama built from a small config, tied embeddings) trains
under every preset with strategy=single's per-step losses; the model types the presets cannot split are refused in
one line. transformers is a test dependency (the [transformers] extra); nothing is downloaded."""

from importlib.util import find_spec

import pytest
import torch
from conftest import QUICK, TOLERANCE, make_runner, refuse_all
from engine_specific import LAST, launcher_of
from layouts import command, layout

from {{ cookiecutter.package_name }}.engine.checkpoints import load_trained
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models.causal_lm import CausalLM
from {{ cookiecutter.package_name }}.parallel.sharding import check_tensor_parallel
from {{ cookiecutter.package_name }}.parallel.split import check_chain, find_split, pipeline_stage, tied_across_stages

pytestmark = pytest.mark.skipif(
    find_spec("transformers") is None, reason="model=causal_lm needs transformers: pip install -e '.[transformers]'"
)
SMALL = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)
STEPS = 3
PARITY = [*QUICK, "model=causal_lm", f"trainer.max_steps={STEPS}", "data.shuffle=false", "data.batch_size=16",
          "trainer.accelerator=cpu", *(f"model.net.config.{key}={value}" for key, value in SMALL.items())]  # fmt: skip
# Every preset, each in its usual launch (tests/layouts.py runs the other launches with the template's models).
PRESETS = ["ddp", "ddp_spawn", "dp", "model_parallel-tp2", "model_parallel-layers", "pipeline-gpipe", "pipeline-1f1b"]


def llama(**config) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(vocab_size=32, max_seq_len=8, model_type="llama", config={**SMALL, **config})


def test_its_split_runs_the_libraries_forward_and_uses_the_libraries_plan():
    """The layers called one after another (as pipeline stages and layer groups call them) compute the library's
    forward exactly; the tensor-parallel plan is the library's own; the tied head is the embedding's parameter,
    held by both end stages (which add up its gradients)."""
    net, tokens = llama(tie_word_embeddings=True), torch.randint(0, 32, (2, 8))
    check_chain(net, tokens)
    stages = [pipeline_stage(net, stage, 2) for stage in range(2)]
    assert torch.equal(stages[1](stages[0](tokens)), net(tokens))
    plan = find_split(net, "model_parallel")[1].tensor_parallel
    assert set(plan) == {f"lm.model.{pattern}" for pattern in net.lm.config.base_model_tp_plan}
    assert net.lm.lm_head.weight is net.lm.model.embed_tokens.weight
    assert [stages for stages, _ in tied_across_stages(net, 2)] == [[0, 1]]
    check_tensor_parallel(net, 2)
    # Grouped-query attention: one key/value head cannot be split over two tensor-parallel ranks.
    with pytest.raises(
        ConfigError, match="self_attn.k_proj projects 1 attention head .*tensor_parallel_size=2 does not"
    ):
        check_tensor_parallel(llama(num_key_value_heads=1), 2)


def test_model_types_the_presets_cannot_split_are_refused_in_one_line():
    """GPT-2 adds a learned position embedding in its forward (not a chain of parts): pipeline and model_parallel
    refuse it, naming what to use; Qwen3's plan has a style torch's two do not cover, refused by tensor parallelism
    only (its pipeline and FSDP2 need no plan); a misspelt type gets the nearest names."""
    gpt2 = CausalLM(32, 8, model_type="gpt2", config=dict(n_embd=16, n_layer=2, n_head=2))
    # no dropout unless given (gpt2's are 0.1 by default: ddp was 1.6e-2 off single)
    assert (gpt2.lm.config.resid_pdrop, gpt2.lm.config.embd_pdrop, gpt2.lm.config.attn_pdrop) == (0.0, 0.0, 0.0)
    assert CausalLM(32, 8, "gpt2", dict(n_embd=16, n_layer=2, n_head=2, attn_pdrop=0.1)).lm.config.attn_pdrop == 0.1
    with pytest.raises(ConfigError, match="model_type=gpt2 is not a chain .* Use a model_type of the Llama layout"):
        find_split(gpt2, "pipeline")
    qwen3 = CausalLM(32, 8, model_type="qwen3", config=SMALL)
    check_tensor_parallel(qwen3, 1)
    with pytest.raises(ConfigError, match="shards layers.\\*.self_attn.q_norm as 'replicated_with_grad_allreduce'"):
        check_tensor_parallel(qwen3, 2)
    with pytest.raises(ConfigError, match="model_type=lama is not a model type of transformers; nearest: llama"):
        CausalLM(32, 8, model_type="lama")
    with pytest.raises(ConfigError, match="model.net.config has intermediate_size, which GPT2Config \\(model.net"):
        CausalLM(32, 8, model_type="gpt2", config={"n_inner": 64, "hidden_size": 16, "intermediate_size": 64})


def test_a_refusal_on_the_command_line_is_its_only_line(tmp_path, train_env):
    """transformers imports torchao where it is installed, whose notes about kernels this machine cannot load came
    before the one-line error (runtime/quiet_logs.py silences them)."""
    gpt2 = ["model.net.model_type=gpt2", "~model.net.config.intermediate_size", "~model.net.config.num_key_value_heads"]
    [run] = refuse_all(tmp_path, train_env, [["model=causal_lm", *gpt2, "strategy=pipeline"]])
    run.assert_rejected("model.net.model_type=gpt2 is not a chain of embedding, decoder layers, norm and head")
    assert [line for line in run.output.splitlines() if line.strip()] == [run.output.strip()]


@pytest.fixture(scope="module")
def runner(tmp_path_factory, train_env):
    return make_runner(tmp_path_factory.mktemp("causal_lm"), train_env)


@pytest.fixture(scope="module")
def single(runner) -> list[float]:
    losses = runner(*PARITY, "strategy=single").losses(STEPS)
    assert len(losses) == STEPS
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_it_trains_under_every_preset_as_on_one_device(runner, single, name):
    if name == "pipeline-1f1b":  # the table's 1F1B row starts by torchrun
        overrides, launcher = (
            ["strategy=pipeline", "trainer.devices=2", "strategy.schedule=1f1b"],
            launcher_of("pipeline", 2),
        )
    else:
        overrides, launcher = command(layout(name))
    run = runner(*PARITY, *overrides, launcher=launcher)
    assert run.losses(STEPS) == pytest.approx(single, abs=TOLERANCE)
    if name == "pipeline-gpipe":  # the stages' checkpoint, put together, is the library's model again
        from transformers import AutoModelForCausalLM  # not at collection: seconds, for this file's tests only

        trained = load_trained(run.run_dir / LAST)
        lm = getattr(trained, "net", trained).lm  # Lightning: the LightningModule's net
        lm.save_pretrained(run.run_dir / "pretrained")
        again = AutoModelForCausalLM.from_pretrained(run.run_dir / "pretrained")
        tokens = torch.randint(0, 32, (2, 8))
        assert torch.equal(again(input_ids=tokens).logits, lm(input_ids=tokens).logits)
        assert again.lm_head.weight is again.model.embed_tokens.weight
