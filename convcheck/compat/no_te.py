"""What exists because Transformer Engine is missing: the TE import stand-in (shim 1), the TE-free hybrid stack
spec, the hybrid final norm (shim 7), the torch-Adam `step` on a reshardable resume (shim 13), megatron-core
0.16's unbound MoE TE names (shim 14), and for multi-latent attention (DeepSeek V2/V3, Kimi, GLM-4.7-Flash) the
bridge's block spec with a local MLA core attention (shim 15), a TE-free MTP block (16) and a plain q projection
without q LoRA (17).
Delete this module once the bridge and megatron-core build without TE."""

from __future__ import annotations

import inspect
from typing import Any

from convcheck.boot import (
    install_import_shims,
)

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_mtp_block_spec,
)
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from megatron.core.optimizer import distrib_optimizer
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from convcheck.compat._patch import _patch
from convcheck.compat.detect import (
    has_attr,
    hybrid_stack,
    optional_module,
    skip,
    te_free,
    transformer_engine_available,
)

# --- Shim 1 -----------------------------------------------------------------------------------------
# The TE import stand-in lives in convcheck.boot, which every module importing megatron.bridge imports first.


# --- TE-free hybrid stack spec (set by convcheck.compat.provider while TE is missing) ----------------
# megatron-bridge 0.6.2 hybrid/hybrid_provider.py:91-104 picks the TE spec, or the modelopt local spec whose `Norm`
# raises without TE (megatron-core 0.19.2 post_training/modelopt/layers.py:61).
def cpu_hybrid_stack_spec() -> Any:
    """TE-free hybrid stack spec (HybridStack, or MambaStack up to megatron-core 0.17): torch norms, local linears,
    DotProductAttention, local (SequentialMLP) MoE.

    Parameter names are the modelopt local spec's: `norm.weight` (Mamba), `input_layernorm.weight` /
    `pre_mlp_layernorm.weight` (attention, MLP, MoE).
    """
    found = hybrid_stack()
    if found is None:
        raise RuntimeError("this megatron-core has no Mamba hybrid stack (HybridStack or MambaStack)")
    _, stack, submodules = found
    bda = get_bias_dropout_add
    mamba = ModuleSpec(
        module=MambaLayer,
        submodules=MambaLayerSubmodules(
            norm=WrappedTorchNorm,
            mixer=ModuleSpec(
                module=MambaMixer,
                submodules=MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear),
            ),
            mamba_bda=bda,
        ),
    )
    attention = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnParallelLinear, core_attention=DotProductAttention, linear_proj=RowParallelLinear
                ),
            ),
            self_attn_bda=bda,
        ),
    )
    mlp = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=ModuleSpec(
                module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
            ),
            mlp_bda=bda,
        ),
    )
    moe = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=get_moe_module_spec(use_te=False, num_experts=8, moe_grouped_gemm=False),  # any num_experts > 0
            mlp_bda=bda,
        ),
    )
    layers = {"mamba_layer": mamba, "attention_layer": attention, "mlp_layer": mlp, "moe_layer": moe}
    mtp = cpu_hybrid_mtp_block_spec()
    if mtp is not None and "mtp_block_spec" in inspect.signature(submodules).parameters:
        layers["mtp_block_spec"] = mtp  # megatron-core 0.19.2 hybrid_block.py:52; earlier stacks build no MTP
    return ModuleSpec(module=stack, submodules=submodules(**layers))


def cpu_hybrid_mtp_block_spec() -> Any:
    """The hybrid MTP block (megatron-core 0.19.2 hybrid_layer_specs.py:71, `_hybrid_mtp_block_spec`) with torch norms
    and a local column-parallel eh_proj: enorm / hnorm / final_layernorm and eh_proj, its inner layers built from the
    stack's own layer specs; None where this megatron-core has no MTP layer submodules."""
    mtp = optional_module("megatron.core.transformer.multi_token_prediction")
    if mtp is None or not hasattr(mtp, "MultiTokenPredictionLayerSubmodules"):
        return None
    layer = ModuleSpec(
        module=mtp.MultiTokenPredictionLayer,
        submodules=mtp.MultiTokenPredictionLayerSubmodules(
            enorm=WrappedTorchNorm,
            hnorm=WrappedTorchNorm,
            eh_proj=ColumnParallelLinear,
            mtp_model_layer=None,
            layer_norm=WrappedTorchNorm,
        ),
    )
    return ModuleSpec(
        module=mtp.MultiTokenPredictionBlock, submodules=mtp.MultiTokenPredictionBlockSubmodules(layer_specs=[layer])
    )


# --- Shim 7 -----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/models/hybrid/hybrid_block.py:215: HybridStack.__init__ builds the final norm
# with TENorm whatever the spec says (TENorm raises without TE); megatron-core 0.16-0.17 do the same in
# ssm/mamba_block.py:166-172 (MambaStack). While TE is missing, the constructor runs with the module's TENorm name
# bound to megatron-core's WrappedTorchNorm (torch.nn.RMSNorm / LayerNorm, parameter `final_norm.weight` as with
# TENorm). Feature detection: the stack class of this release (convcheck.compat.detect.HYBRID_STACKS); skipped when
# it has none or its module binds no TENorm.
def install_hybrid_final_norm() -> None:
    """Install shim 7 (idempotent) while TE is missing."""
    if transformer_engine_available():
        return
    found = hybrid_stack()
    if found is None or not hasattr(found[0], "TENorm"):
        skip(7, "no hybrid stack module binding TENorm in this megatron-core")
        return
    block, stack, _ = found

    def torch_final_norm(original: Any) -> Any:
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if not te_free():
                return original(self, *args, **kwargs)
            saved = block.TENorm
            block.TENorm = WrappedTorchNorm
            try:
                return original(self, *args, **kwargs)
            finally:
                block.TENorm = saved

        return __init__

    _patch(stack, "__init__", torch_final_norm)


# --- Shim 14 ----------------------------------------------------------------------------------------
# megatron-core 0.16.x, megatron/core/transformer/moe/moe_utils.py:24-37 imports te_general_gemm and the fused MoE
# kernels from TE inside try/except and, without TE, leaves the names unbound; RouterGatingLinearFunction.forward
# (:1192) then raises NameError on `te_general_gemm is not None` at every router forward. megatron-core 0.17+ bind
# them to None (moe_utils.py:27-50), which selects upstream's torch.mm path. While TE is missing, the names this
# release leaves unbound are bound to None, as 0.17+ does; nothing is bound where the module already has them.
MOE_UTILS_TE_NAMES = (
    "fused_compute_score_for_moe_aux_loss",
    "fused_moe_aux_loss",
    "fused_permute",
    "fused_permute_with_probs",
    "fused_sort_chunks_by_index",
    "fused_sort_chunks_by_index_with_probs",
    "fused_topk_with_score_function",
    "fused_unpermute",
    "te_general_gemm",
)


def install_moe_utils_te_names() -> None:
    """Install shim 14 (idempotent) while TE is missing: bind the TE names moe_utils left unbound to None."""
    if transformer_engine_available():
        return

    unbound = [name for name in MOE_UTILS_TE_NAMES if not hasattr(moe_utils, name)]
    if not unbound:
        skip(14, "moe_utils binds its TE names without TE (megatron-core >= 0.17)")
    for name in unbound:
        setattr(moe_utils, name, None)


def install() -> None:
    """Install shims 1, 7, 14, 16 and 17 (idempotent; shim 13 is installed where the optimizer is built, shim 15 is
    in the spec the provider gets). Shim 1 comes first: before megatron.bridge imports."""
    install_import_shims()
    install_hybrid_final_norm()
    install_moe_utils_te_names()
    if not transformer_engine_available():
        install_cpu_mtp_block_spec()
        install_plain_q_proj()


# --- Shim 13 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, megatron/core/optimizer/distrib_optimizer.py:1219: without Apex or TE the distributed
# optimizer runs torch's Adam, whose state holds a tensor `step` (put there by load_state_dict, :1026-1032).
# _set_main_param_and_optimizer_states copies every tensor state from `tensors`, but the fully_reshardable loader
# leaves `step` out of them (:2390), so every resume raises KeyError: 'step'. While Apex and TE are missing, the
# copy runs with `step` given as None, which upstream skips; the step itself was already restored at :1031.
def install_torch_adam_step() -> None:
    """Install shim 13 (idempotent) while megatron-core's distributed optimizer runs without Apex and TE."""
    if distrib_optimizer.HAVE_APEX_OR_TE:
        return

    def step_left_to_load_state_dict(original: Any) -> Any:
        def _set_main_param_and_optimizer_states(self, model_param, tensors):  # type: ignore[no-untyped-def]
            if "step" not in tensors:
                tensors = {**tensors, "step": None}
            return original(self, model_param, tensors)

        return _set_main_param_and_optimizer_states

    _patch(distrib_optimizer.DistributedOptimizer, "_set_main_param_and_optimizer_states", step_left_to_load_state_dict)


# --- Shim 15 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, transformer/multi_latent_attention.py:207-217: MLASelfAttention builds its core attention
# with k_channels (qk_nope + qk_rope) and v_channels (v_head_dim), which only TEDotProductAttention accepts; the
# local DotProductAttention (transformer/dot_product_attention.py:42) has no such parameters, and its output view
# (:248) is kv_channels x heads wide. Its forward is otherwise shape-generic (q.k over k_channels, weights.v over
# v_channels). convcheck's TE-free MLA spec uses the subclass below: the same module, its output v_channels x heads
# wide. MLA passes its softmax scale (with Yarn's mscale) explicitly, so the default scale is never used.
_MLA_CLASS: dict[str, type] = {}


def mla_core_attention() -> type:
    """megatron-core's local DotProductAttention taking MLA's `k_channels` / `v_channels` (one class per process)."""
    if "class" not in _MLA_CLASS:

        class MLADotProductAttention(DotProductAttention):
            """Local core attention whose context is [s, b, v_channels x heads per TP rank]."""

            def __init__(self, *args: Any, k_channels: int | None = None, v_channels: int | None = None, **kw: Any):
                super().__init__(*args, **kw)
                if v_channels is not None:
                    self.hidden_size_per_attention_head = v_channels
                    self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

        _MLA_CLASS["class"] = MLADotProductAttention
    return _MLA_CLASS["class"]


def local_attention_takes_mla_channels() -> bool:
    """True when megatron-core's local DotProductAttention accepts k_channels (shim 15 is then not needed)."""
    return "k_channels" in inspect.signature(DotProductAttention.__init__).parameters


def cpu_mla_decoder_block_spec(config: Any, vp_stage: int | None = None) -> Any:
    """The decoder block spec the DeepSeek bridges choose (megatron-core's get_gpt_decoder_block_spec: MLA, dense or
    MoE per layer from moe_layer_freq), TE-free, with shim 15's core attention; without q LoRA no q layernorm (HF's
    q_proj reads the input-normed hidden states; mla_qk_norm_config.py:171 rejects one)."""
    kwargs = {"vp_stage": vp_stage} if "vp_stage" in inspect.signature(get_gpt_decoder_block_spec).parameters else {}
    block = get_gpt_decoder_block_spec(
        config, use_transformer_engine=False, normalization=config.normalization, **kwargs
    )
    for layer in block.layer_specs:
        _mla_layer_on_cpu(layer, config)
    return block


def _mla_layer_on_cpu(layer: Any, config: Any) -> None:
    """Shim 15's core attention (and no q layernorm without q LoRA) in one layer spec, if it is an MLA layer."""
    attention = getattr(layer.submodules, "self_attention", None)
    if attention is None or not (isinstance(attention.module, type) and issubclass(attention.module, MLASelfAttention)):
        return
    if not local_attention_takes_mla_channels():
        attention.submodules.core_attention = mla_core_attention()
    if getattr(config, "q_lora_rank", None) is None:
        attention.submodules.q_layernorm = IdentityOp


# --- Shim 16 ----------------------------------------------------------------------------------------
# megatron-bridge 0.6.2, models/gpt_provider.py:371 and :376: mtp_block_spec asks for the TE MTP spec whatever is
# installed (use_transformer_engine=True), so megatron-core's gpt_layer_specs.py:738 calls TESpecProvider, None
# without TE. GPTModelProvider.provide looks the function up by name (gpt_provider.py:312); while TE is missing the
# module's name is bound to the same steps with use_transformer_engine=False (megatron-core's local MTP spec), each
# MTP layer getting the block spec's last layer (shim 15's core attention included).
def cpu_mtp_block_spec(config: Any, vp_stage: int | None = None) -> Any:
    """The bridge's MTP block spec, TE-free (None when the model has no MTP layers)."""
    if not getattr(config, "mtp_num_layers", None):
        return None
    spec = config.transformer_layer_spec
    if callable(spec) and not hasattr(spec, "submodules"):
        spec = spec(config, vp_stage=vp_stage) if "vp_stage" in inspect.signature(spec).parameters else spec(config)
    if hasattr(spec, "layer_specs"):
        if not spec.layer_specs:  # a stage without decoder layers: the last layer of the whole model
            spec = get_gpt_decoder_layer_specs(
                config, use_transformer_engine=False, normalization=config.normalization, qk_l2_norm=config.qk_l2_norm
            )[-1]
            _mla_layer_on_cpu(spec, config)
        else:
            spec = spec.layer_specs[-1]
    return get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False, vp_stage=vp_stage)


def install_cpu_mtp_block_spec() -> None:
    """Install shim 16 (idempotent) while TE is missing; skipped where the bridge has no gpt_provider.mtp_block_spec."""
    module = optional_module("megatron.bridge.models.gpt_provider")
    if module is None or not hasattr(module, "mtp_block_spec"):
        skip(16, "megatron.bridge.models.gpt_provider.mtp_block_spec is absent in this release")
        return

    def te_free_mtp_block_spec(original: Any) -> Any:
        def mtp_block_spec(config: Any, vp_stage: int | None = None) -> Any:
            return cpu_mtp_block_spec(config, vp_stage) if te_free() else original(config, vp_stage)

        return mtp_block_spec

    _patch(module, "mtp_block_spec", te_free_mtp_block_spec)


# --- Shim 17 ----------------------------------------------------------------------------------------
# megatron-core 0.19.2, transformer/mla_qk_norm_config.py:148: with qk_layernorm and no q LoRA, linear_q_proj must be
# the backend's fused norm + linear (`_mla_fused_linear_or_default`), which the local backend lacks (:243 raises
# "qk_layernorm requires TransformerEngine"). HF (DeepSeek-V2-Lite, Moonlight: q_lora_rank None) applies q_proj to
# the input-normed hidden states, with no norm of its own: where the backend has no fused implementation, the spec's
# plain linear is kept for linear_q_proj.
def install_plain_q_proj() -> None:
    """Install shim 17 (idempotent); skipped where this megatron-core has no MLA qk-norm resolver."""
    module = optional_module("megatron.core.transformer.mla_qk_norm_config")
    if module is None or not has_attr(module, "QKNormConfigResolver._mla_fused_linear_or_default"):
        skip(17, "mla_qk_norm_config.QKNormConfigResolver._mla_fused_linear_or_default is absent in this release")
        return

    def plain_q_proj_without_fused_impl(original: Any) -> Any:
        def _mla_fused_linear_or_default(self, module_spec, module_name):  # type: ignore[no-untyped-def]
            if module_name == "linear_q_proj" and self.fused_norm_linear_impl is None and module_spec is not None:
                return module_spec
            return original(self, module_spec, module_name)

        return _mla_fused_linear_or_default

    _patch(module.QKNormConfigResolver, "_mla_fused_linear_or_default", plain_q_proj_without_fused_impl)
