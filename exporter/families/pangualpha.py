"""PanGu-α (MindFormers' PanguAlphaHeadModel; 2.6B and 13B): GPT-style pre-norm blocks (LayerNorm,
eps 1e-5; q, k, v, o with biases; FastGeLU MLP with biases), learned absolute positions added to the
word embedding, then the final LayerNorm and the top query layer (models/top_query.py): a block whose
query is a learned embedding of the position (`top_query_embedding`); the head is the word embedding
(tied). MindFormers' `num_layers` counts the top query layer: `backbone.blocks` holds num_layers - 1.

Order as MindFormers' PanguAlphaModel runs without pipeline stages (the inference path): blocks,
`backbone.layernorm`, `backbone.top_query_layer`, head. Both position tables have `seq_length` rows.

Weights: MindFormers' parameter names. Checkpoints written by upstream's
`mindformers/models/pangualpha/convert_weight.py` hold the three tables under the names that script
gives them (`word_embedding_table`, `position_embedding_table`, `query_embedding_table`); both are read.
MindFormers has no Hugging Face layout of PanGu-α, so there is no HF plan.

Tokenizer: `vocab.model`, jieba + sentencepiece (lite_runtime/tokenizers/jieba_sentencepiece.py),
used for the shipped sentencepiece model whatever its file name; `<eot>` is its EOS.
"""
from __future__ import annotations

from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import mindformers_gpt_block
from exporter.weights.plan import WeightPlan, rule
from exporter.families.base import Family, register_family



@register_family
class PanguAlpha(Family):
    spec = RUNTIME_FAMILIES["pangualpha"]
    hf_model_types = ()
    mindformers_types = ("PanguAlphaHeadModel", "PanguAlphaConfig", "PanguAlphaModel")
    features = dict(norm="layer", norm_eps=1e-5, positions="learned", mlp="fast_gelu", qkv_bias=True, o_bias=True,
                    mlp_bias=True, tie_word_embeddings=True, top_query=True)
    mindformers_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_heads": "n_heads", "ffn_hidden_size": "intermediate_size"}
    mindformers_required = {"hidden_act": ("fast_gelu",), "post_layernorm_residual": (False,), "use_moe": (False,)}
    # Read and let pass: eod_token_id is the training data's document separator; the expert counts
    # are not used while use_moe is false.
    mindformers_also_read = ("eod_token_id", "expert_num", "per_token_num_experts_chosen")

    mindformers_weights = WeightPlan([
        rule("backbone.embedding.word_embedding.embedding_table", "embed.weight"),
        rule("word_embedding_table", "embed.weight"),
        rule("backbone.embedding.position_embedding.embedding_table", "pos_embed.weight"),
        rule("position_embedding_table", "pos_embed.weight"),
        rule("backbone.top_query_embedding.embedding_table", "top_query.query_embed.weight"),
        rule("query_embedding_table", "top_query.query_embed.weight"),
        *mindformers_gpt_block("backbone.blocks.{L}", "layers.{L}"),
        *mindformers_gpt_block("backbone.top_query_layer", "top_query"),
        rule("backbone.layernorm.gamma", "final_norm.weight"),
        rule("backbone.layernorm.beta", "final_norm.bias"),
    ])

    @classmethod
    def tokenizer_options(cls):
        return dict(super().tokenizer_options(), jieba=True)

    @classmethod
    def from_mindformers(cls, model_config, where):
        sizes = super().from_mindformers(model_config, where)
        if model_config.get("seq_length"):
            sizes["max_position_embeddings"] = model_config["seq_length"]   # both tables have seq_length rows
        return sizes
