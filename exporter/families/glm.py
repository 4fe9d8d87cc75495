"""GLM v1, ChatGLM-6B's shape (`glm`, `chatglm`; MindFormers' `glm_6b`, `chatglm_6b`).

As MindFormers' GLMForPreTraining / GLMChatModel run it (mindformers/models/glm/{glm,layers,attention}.py)
and THUDM's modeling_chatglm.py: word embedding; per layer input_layernorm (LayerNorm, eps from the
config), attention with a fused per-head query_key_value ([q_h; k_h; v_h] blocks of head_dim rows) and
biases on every linear, DeepNorm residuals (x = n·alpha + attn(n) with n = input_layernorm(x); then
m = post_attention_layernorm(x), out = m·alpha + mlp(m); alpha = sqrt(2·num_layers)), a GELU MLP (the
tanh form: MindSpore's GeLU, chatglm-6b's gelu_impl); final_layernorm, untied lm_head.

2-D rotary: the first half of each head is rotated (rotate-half over head_dim/2, base 10000) by the
position id, the second half by the block position id; upstream rounds the rotary frequencies, angles
and cos/sin to float16 (np.float16 in MindFormers, .half() in the remote code), and so do the tables
here. Upstream scales q by 1/(sqrt(head_dim)·(layer_id+1)) and the scores back by (layer_id+1)
(query_key_layer_scaling_coeff): in float32 that is the plain 1/sqrt(head_dim), which is what is built.
Positions and the prefix attention (keys before <sop> seen by every query) come from two per-row graph
inputs, context_length and mask_position, made by the runtime's feed builder from each prompt
(lite_runtime/decode/inputs.py GlmInputsOfInfer) at the [MASK] / [gMASK] ids the runtime's spec declares
(FamilySpec.row_input_tokens, upstream's ids by default); the config's own ids go to the manifest.

Weights: MindFormers' names (convert_weight.py: the Hugging Face names with word_embeddings.weight ->
embedding_table and the layernorms' weight/bias -> gamma/beta) and the Hugging Face ChatGLM-6B folder's.
A ChatGLM-6B folder is `model_type: chatglm` like ChatGLM2/3: this family claims those with
`position_encoding_2d` (Family.claims_hf).
"""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.plan import WeightPlan, qkv_per_head, rule
from exporter.families.base import Family, register_family


def _plan(embedding: str, norm_names: dict) -> WeightPlan:
    """The ChatGLM-6B layout; `norm_names`: the layernorms' tensor names (weight/bias or gamma/beta)."""
    p = "transformer.layers.{L}."
    norms = [(p + "input_layernorm", "layers.{L}.attn_norm"), (p + "post_attention_layernorm", "layers.{L}.mlp_norm"),
             ("transformer.final_layernorm", "final_norm")]
    return WeightPlan([
        rule("transformer.word_embeddings." + embedding, "embed.weight"),
        *[rule(f"{source}.{theirs}", f"{target}.{ours}") for source, target in norms for theirs, ours in norm_names.items()],
        rule(p + "attention.query_key_value.{wb}", "layers.{L}.attn.q.{wb}", "layers.{L}.attn.k.{wb}",
             "layers.{L}.attn.v.{wb}", split=qkv_per_head),
        rule(p + "attention.dense.{wb}", "layers.{L}.attn.o.{wb}"),
        rule(p + "mlp.dense_h_to_4h.{wb}", "layers.{L}.mlp.up.{wb}"),
        rule(p + "mlp.dense_4h_to_h.{wb}", "layers.{L}.mlp.down.{wb}"),
        rule("lm_head.weight", "head.weight"),
    ], ignore=[r".*rotary_emb\.inv_freq"])


@register_family
class Glm(Family):
    spec = RUNTIME_FAMILIES["glm"]
    hf_model_types = ("chatglm",)
    mindformers_types = ("GLMChatModel", "GLMForPreTraining", "GLMConfig")
    features = dict(norm="layer", norm_eps=1e-5, positions="rotary_2d", rotary_fp16_tables=True, mlp="gelu_tanh",
                    qkv_bias=True, o_bias=True, mlp_bias=True, tie_word_embeddings=False, prefix_attention=True,
                    deepnorm=True)
    mindformers_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_heads": "n_heads", "inner_hidden_size": "intermediate_size",
                        "layernorm_epsilon": "norm_eps", "mask_token_id": "mask_token_id",
                        "gmask_token_id": "gmask_token_id"}
    # layernorm_order: the layer's construct is the same for pre and post (sandwich adds norms)
    mindformers_required = {"position_encoding_2d": (True,), "activation_func": ("GELU",),
                            "use_final_layernorm": (True,), "layernorm_order": ("post", "pre")}
    # is_enhanced_encoder: upstream's flag of the ChatGLM-6B chat model, no effect on the network
    mindformers_also_read = ("hidden_size_per_attention_head", "is_enhanced_encoder")

    hf_weights = _plan("weight", {"weight": "weight", "bias": "bias"})
    mindformers_weights = _plan("embedding_table", {"gamma": "weight", "beta": "bias"})

    @classmethod
    def claims_hf(cls, hf: dict) -> bool:
        return "position_encoding_2d" in hf or "inner_hidden_size" in hf

    @classmethod
    def check_hf(cls, hf, where):
        if not hf.get("position_encoding_2d", True):
            raise UnsupportedError(f"{where}: position_encoding_2d false is not supported by the glm family; "
                                   "allowed: true")
        if hf.get("quantization_bit"):
            raise UnsupportedError(f"{where}: quantization_bit {hf['quantization_bit']!r} is not supported; "
                                   "export the float checkpoint")
        if hf.get("pre_seq_len"):
            raise UnsupportedError(f"{where}: pre_seq_len {hf['pre_seq_len']!r} (P-tuning v2 prefixes) is not "
                                   "supported; export the model without its prefix encoder")

    hf_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
               "num_attention_heads": "n_heads", "inner_hidden_size": "intermediate_size",
               "layernorm_epsilon": "norm_eps", "mask_token_id": "mask_token_id", "gmask_token_id": "gmask_token_id"}

    @classmethod
    def from_mindformers(cls, model_config, where):
        per_head = model_config.get("hidden_size_per_attention_head")
        heads, hidden = model_config.get("num_heads"), model_config.get("hidden_size")
        if per_head not in (None, "None") and heads and hidden and int(per_head) * heads != hidden:
            raise UnsupportedError(f"{where}: hidden_size_per_attention_head {per_head} * num_heads != hidden_size "
                                   "is not supported")
        return super().from_mindformers(model_config, where)
