"""model=causal_lm: a causal language model of Hugging Face transformers (Llama, Qwen2, Mistral, ... by
`model_type`), built from a config (random weights, nothing downloaded), and how the parallel presets split it.

`CausalLM` holds the library's model as `lm` (its parameters keep the library's names under `lm.`) and returns the
next-token logits (B, T, V) the engines train on. Every preset trains it: the data-parallel ones as it is; the
ones that split it through its `Split`, built from the model itself (`causal_lm_split`, below): the token
embedding first, the decoder layers as blocks, the final norm and head last, and the library's own tensor-parallel
plan for the layers. A decoder layer run alone (a pipeline stage, a layer group) is given the rotary position
embeddings and positions the model's forward would give it (`_positions_for_a_layer_alone`), so the chain of parts
is the model's forward (checked before training by split.check_chain). Tied embeddings (`tie_word_embeddings`)
stay one parameter as the GPT's do.

Model types whose forward is not that chain are refused by the presets that split the model, in one line, and
train under single, ddp, ddp_spawn and dp: GPT-2-style models (`model_type=gpt2`: a learned position embedding
added in the forward, Conv1D layers), and any whose forward does more between the parts (the chain check).
"""

from difflib import get_close_matches

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from ..errors import ConfigError
from ..parallel.split import RefusedStyle, Split, register_split

# The library's tensor-parallel styles this template maps to torch's. Others (colwise_gather_output,
# replicated_with_grad_allreduce, ...) need hooks the template does not write: tensor parallelism refuses them.
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


class CausalLM(nn.Module):
    """A transformers causal LM from its config: token ids (B, T) -> next-token logits (B, T, vocab_size).

    model_type: the library's name of the architecture ("llama", "qwen2", "mistral", ...); config: its config
    class's arguments (hidden_size, num_hidden_layers, num_attention_heads, ...)."""

    def __init__(
        self, vocab_size: int, max_seq_len: int, model_type: str = "llama", config: dict | None = None
    ) -> None:
        super().__init__()
        try:
            from transformers import AutoConfig, AutoModelForCausalLM
        except ImportError as error:
            raise ConfigError(
                f"model=causal_lm needs transformers ({error}): pip install -e '.[transformers]'"
            ) from None
        try:
            # No special tokens unless given: the library's defaults (ids of its tokenizer's vocabulary) may lie
            # outside vocab_size.
            specials = dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"))
            lm_config = AutoConfig.for_model(
                model_type, vocab_size=vocab_size, max_position_embeddings=max_seq_len, **specials | dict(config or {})
            )
        except ValueError:  # an unknown model_type (the library's message lists all of its several hundred)
            from transformers import CONFIG_MAPPING

            nearest = get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3)
            raise ConfigError(
                f"model.net.model_type={model_type} is not a model type of transformers; nearest: "
                f"{', '.join(nearest) or 'none'} (any causal LM's type: llama, qwen2, mistral, ...)"
            ) from None
        unknown = [key for key in config or {} if not _takes(lm_config, key)]
        if unknown:  # (the library keeps any keyword: a Llama key given to gpt2 sized nothing, silently)
            removals = " ".join(f"~model.net.config.{key}" for key in unknown)
            raise ConfigError(
                f"model.net.config has {', '.join(unknown)}, which {type(lm_config).__name__} "
                f"(model.net.model_type={model_type}) does not take: remove {'them' if unknown[1:] else 'it'} with "
                f"{removals}, or give the model type's own names"
            )
        lm_config.use_cache = False  # no key/value cache: training reads each sequence once
        # No dropout unless given: each process draws its own masks, so presets would not match single (gpt2's
        # resid_pdrop, embd_pdrop and attn_pdrop are 0.1 by default, llama's attention_dropout 0).
        for key, value in lm_config.to_dict().items():
            if ("dropout" in key or "pdrop" in key) and isinstance(value, float) and key not in (config or {}):
                setattr(lm_config, key, 0.0)
        # sdpa: causal without a mask tensor, in the model's forward and in a layer run alone alike.
        self.lm = AutoModelForCausalLM.from_config(lm_config, attn_implementation="sdpa")
        self.model_type = model_type
        base = getattr(self.lm, "model", None)
        if isinstance(getattr(base, "layers", None), nn.ModuleList) and hasattr(base, "rotary_emb"):
            for layer in base.layers:
                # The rotary module has no weights (its inv_freq buffer is not saved): one shared module, registered
                # in each layer too so that it moves with the layer to its stage's device.
                layer.rotary_emb = base.rotary_emb
                layer.register_forward_pre_hook(_positions_for_a_layer_alone, with_kwargs=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=tokens).logits


def _takes(lm_config: object, key: str) -> bool:
    """Whether the library's config class of this model type has `key`, by its own name or an alias of it (gpt2's
    n_embd is hidden_size too)."""
    defaults = type(lm_config)()
    return key in defaults.to_dict() or key in getattr(defaults, "attribute_map", {})


def _positions_for_a_layer_alone(layer: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """A decoder layer called with hidden states only (as a pipeline stage or a layer group calls it) gets the
    positions 0..T-1 and their rotary embeddings, which the model's forward computes once and passes to each layer;
    the model's own calls pass them and are left alone."""
    if kwargs.get("position_embeddings") is not None:
        return None
    hidden = args[0]
    positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
    return args, {**kwargs, "position_ids": positions, "position_embeddings": layer.rotary_emb(hidden, positions)}


def causal_lm_split(net: CausalLM) -> Split:
    """The Split of the library's decoder-only layout (model.embed_tokens, model.layers, model.norm, lm_head), with
    its own tensor-parallel plan; a ConfigError naming what to change for a model of another layout."""
    base = getattr(net.lm, "model", None)
    if not all(hasattr(base, part) for part in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise ConfigError(
            f"model.net.model_type={net.model_type} is not a chain of embedding, decoder layers, norm and head with "
            "rotary positions (GPT-2-style models add a learned position embedding in the forward and use Conv1D "
            "layers): strategy=pipeline, model_parallel and fsdp cannot split it. Use a model_type of the Llama "
            "layout (llama, qwen2, mistral, ...), or strategy=single, ddp, ddp_spawn or dp"
        )
    plan = {}
    for pattern, style in (getattr(net.lm.config, "base_model_tp_plan", None) or {}).items():
        unmapped = (
            f"model.net.model_type={net.model_type}'s tensor-parallel plan shards {pattern} as {style!r}, which "
            f"the template does not map to torch (valid: {', '.join(STYLES)}): use strategy.tensor_parallel_size=1 "
            "(FSDP2), strategy.mode=layers, strategy=pipeline or a data-parallel preset"
        )
        plan[f"lm.model.{pattern}"] = STYLES[style]() if style in STYLES else RefusedStyle(unmapped)
    return Split(
        first=["lm.model.embed_tokens"],
        blocks=["lm.model.layers.*"],
        last=["lm.model.norm", "lm.lm_head"],
        tensor_parallel=plan,
    )


register_split(CausalLM, causal_lm_split)
