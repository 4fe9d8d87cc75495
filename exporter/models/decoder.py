"""`CausalLM`: one rank's share of a decoder-only model, assembled from blocks chosen by the
config's features, with its graph entry points: `prefill` and `increment` (kv modes io and
in_graph), or the one `packed_step` of the packed kv mode (prefill and decode alike). With
`top_query` (PanGu-α) the last of num_layers is the top query layer (models/top_query.py), run
after the final norm, its K/V cache the last pair.

Parameter names are the project's canonical names (`embed.weight`, `layers.0.attn.q.weight`,
`layers.0.mlp.up.bias`, `final_norm.weight`, `head.weight` ...); each family's weight plan maps its
MindFormers and Hugging Face names onto them. Graph I/O is the runtime contract's
(lite_runtime/contract/families.py).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from lite_runtime.contract.families import PACKED_INPUTS
from lite_runtime.contract.quant import head_reads_embedding
from exporter.models.attention import Attention, BuildContext, ScoreBias, shape_tensor
from exporter.models.config import DecoderConfig
from exporter.models.linear import Collective, ColumnParallelLinear, Embedding
from exporter.models.mlp import make_mlp
from exporter.models.norms import make_norm
from exporter.models.packed import (CONTEXT, META, PAST, POSITION, ROW, ROWS, KernelAttend, PackedAttend, PackedBias,
                                    PagedAttend)
from exporter.models.positions import rotary_2d_tables, rotary_tables
from exporter.models.top_query import TopQueryLayer


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        k = ctx.layer_kernels
        self.attn_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype, k)
        self.attn = Attention(cfg, ctx)
        self.mlp_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype, k)
        lora = {n: ctx.lora_width for n in ("gate", "up", "down") if f"mlp.{n}" in ctx.lora_targets}
        self.mlp = make_mlp(cfg.mlp, cfg.hidden_size, cfg.intermediate_size, ctx.world_size, ctx.dtype, cfg.mlp_bias,
                            ctx.flat, lora, ctx.graph_collectives, k)
        self.deepnorm, self.alpha = cfg.deepnorm, cfg.deepnorm_alpha

    def finish(self, x, attn_out, select=None, normed=None):
        """The residuals around attention and MLP. `normed`: attn_norm(x), which DeepNorm (GLM v1)
        scales by alpha as its residual instead of x (and likewise the MLP's normed input)."""
        if self.deepnorm:
            m = self.mlp_norm(normed * self.alpha + attn_out)
            return m * self.alpha + self.mlp(m, select)
        h = x + attn_out
        return h + self.mlp(self.mlp_norm(h), select)


class StepShapes(nn.Cell):
    """Reshape targets and the gather axis of the packed step (Lite 2.0 builds graphs with dynamic
    dimensions only with these as tensors)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.flat, self.per_token = shape_tensor(-1), shape_tensor(-1, 1, head_dim)
        self.flat_column = shape_tensor(-1, 1)
        self.token_column = shape_tensor(-1, 1, 1, 1)
        self.row_of_tokens = shape_tensor(1, -1)
        self.axis0 = Tensor(np.array([0], np.int32))


class CausalLM(nn.Cell):
    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        cfg.check_world_size(ctx.world_size)
        cfg.check_seq_length(ctx.seq)
        self.cfg = cfg
        self.batch, self.seq, self.kv_mode, self.dtype = ctx.batch, ctx.seq, ctx.kv_mode, ctx.dtype
        packed = ctx.flat
        if packed:
            self.dyn = StepShapes(cfg.head_dim)
            self.packed_bias = PackedBias(cfg, ctx)
            self.attend = PackedAttend(cfg.n_kv_heads // ctx.world_size, cfg.group, cfg.head_dim,
                                       1.0 / float(np.sqrt(cfg.head_dim)))
        self.attention_kernel = packed and ctx.attention_kernel
        self.paged = self.attention_kernel and ctx.paged_kv
        if self.attention_kernel:
            self.kernel_attend = PagedAttend(cfg, ctx) if self.paged else KernelAttend(cfg, ctx)
            # the paged store's layer of each cache layer (the blocks, then PanGu-alpha's top query layer)
            self.store_layers = tuple(Tensor(np.array([float(i)], np.float32)) for i in range(cfg.num_layers))
            self.concat_columns = ops.Concat(1)
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size, ctx.dtype, packed)
        self.learned_positions = cfg.positions == "learned"
        if self.learned_positions:
            self.pos_embed = Embedding(cfg.max_position_embeddings, cfg.hidden_size, ctx.dtype, packed)
        self.use_embed_norm = cfg.embed_norm
        if cfg.embed_norm:
            self.embed_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype, ctx.layer_kernels)
        self.layers = nn.CellList([DecoderLayer(cfg, ctx) for _ in range(cfg.num_blocks)])
        self.final_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype, ctx.layer_kernels)
        self.use_top_query = cfg.top_query
        if cfg.top_query:
            self.top_query = TopQueryLayer(cfg, ctx)
        # A tied head on one rank reads the embedding table itself (no second copy); under tensor
        # parallelism each rank holds its vocabulary rows of it as `head.weight`, and so does one rank
        # whose head's scheme is not the embedding's. In an export with the products on the kernels the tied
        # head's product runs on a kernel reading the table as it is stored (float32 panels, or int8 with its
        # scales), and a kernel looks the embeddings up in it.
        self.head_is_embedding = head_reads_embedding(cfg.tie_word_embeddings, ctx.world_size, ctx.own_head)
        if not self.head_is_embedding:
            self.head = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, ctx.world_size, ctx.dtype,
                                             flat=packed)
        # a tied head on a table left to Lite (on the kernels the product is the table's own: table_product)
        self.head_matmul = ops.MatMul(transpose_b=True)
        self.gather_vocab = Collective.gather_last_dim(ctx.world_size if ctx.graph_collectives else 1, ctx.rank,
                                                     cfg.vocab_size // ctx.world_size)
        self.bias = ScoreBias(cfg, ctx)
        cos, sin = rotary_tables(ctx.seq, cfg.head_dim, cfg.rotary_dim, cfg.rope_theta, cfg.rotary_interleaved,
                                 cfg.rotary_fp16_tables)
        self.cos_table, self.sin_table = Tensor(cos), Tensor(sin)
        self.cos_prefill = Tensor(cos.reshape(1, 1, ctx.seq, -1), ctx.dtype)
        self.sin_prefill = Tensor(sin.reshape(1, 1, ctx.seq, -1), ctx.dtype)
        self.positions = Tensor(np.arange(ctx.seq, dtype=np.int32).reshape(1, ctx.seq))
        self.batch_positions = Tensor(np.tile(np.arange(ctx.seq, dtype=np.int32), (ctx.batch, 1)))
        self.row_offsets = Tensor(np.arange(ctx.batch, dtype=np.int32) * ctx.seq)
        # GLM v1: 2-D rotary from each row's context_length and mask_position (graph inputs); block
        # positions reach seq_length, hence seq + 1 rows
        self.two_d, self.prefix = cfg.positions == "rotary_2d", cfg.prefix_attention
        if self.two_d:
            cos_a, sin_a, cos_b, sin_b = rotary_2d_tables(ctx.seq + 1, cfg.head_dim, cfg.rope_theta,
                                                          cfg.rotary_fp16_tables)
            self.cos_a, self.sin_a, self.cos_b, self.sin_b = Tensor(cos_a), Tensor(sin_a), Tensor(cos_b), Tensor(sin_b)
            self.steps_prefill = Tensor(np.tile(np.arange(ctx.seq, dtype=np.float32), (ctx.batch, 1)))
        self.lora = ctx.lora_width > 0
        if self.lora:   # the slot each SLoRA column belongs to (columns of one slot are adjacent)
            slots = ctx.lora_width // ctx.lora_rank
            self.lora_slot_of_column = Tensor(np.repeat(np.arange(slots, dtype=np.float32),
                                                        ctx.lora_rank).reshape(1, -1))
        self.gather = ops.Gather()
        self.reshape = ops.Reshape()
        self.cast = ops.Cast()
        self.equal = ops.Equal()
        self.ones_like = ops.OnesLike()
        self.cumsum = ops.CumSum()
        self.greater_equal = ops.GreaterEqual()
        self.sum_last = ops.ReduceSum()
        self.matmul_ta = ops.MatMul(transpose_a=True)
        self.transpose = ops.Transpose()

    def _rotary_2d(self, t, context, mask_position, column, flat, shape, axis):
        """cos, sin (`shape`) of GLM's 2-D positions for tokens at indices t (B, T) float32 of rows
        with context_length and mask_position (B,) int32: before the context length position t and
        block position 0, from it on position mask_position and block position t - context + 1.
        `column`, `flat`: reshape targets (B, 1) and (-1,); `axis`: the gather axis."""
        c = self.reshape(self.cast(context, ms.float32), column)
        m = self.reshape(self.cast(mask_position, ms.float32), column)
        after = self.cast(self.greater_equal(t, c), ms.float32)
        pos = self.cast(self.reshape(t + after * (m - t), flat), ms.int32)
        block = self.cast(self.reshape(after * (t - c + 1.0), flat), ms.int32)
        cos = self.gather(self.cos_a, pos, axis) * self.gather(self.cos_b, block, axis)
        sin = self.gather(self.sin_a, pos, axis) + self.gather(self.sin_b, block, axis)
        return self.cast(self.reshape(cos, shape), self.dtype), self.cast(self.reshape(sin, shape), self.dtype)

    def _embed(self, ids, positions):
        x = self.embed(ids)
        if self.learned_positions:
            x = x + self.pos_embed(positions)
        if self.use_embed_norm:
            x = self.embed_norm(x)
        return x

    def _select(self, input_ids, adapter_ids, rows, column):
        """(tokens, slots·r) float: 1 on the columns of each token's adapter (its row's id), in the
        token order the linear layers see (row-major over input_ids); None without adapters."""
        if not self.lora:
            return None
        per_token = self.cast(self.reshape(adapter_ids, rows), ms.float32) * \
            self.cast(self.ones_like(input_ids), ms.float32)
        return self.cast(self.equal(self.reshape(per_token, column), self.lora_slot_of_column), self.dtype)

    def _logits(self, hidden):
        """hidden (B, H) of each row's last valid token -> float32 logits (B, vocab). The final norm
        is applied here, or (top query layer) already before that layer."""
        h = hidden if self.use_top_query else self.final_norm(hidden)
        if self.head_is_embedding and self.embed.kernel is not None and self.embed.kernel.count == 2:   # int8, scales
            logits = self.embed.kernel.table_product(h, self.embed.kernel.weight, self.embed.kernel.weight_scale)
        elif self.head_is_embedding and self.embed.kernel is not None:     # float32 panels
            logits = self.embed.kernel.table_product(h, self.embed.kernel.weight)
        elif self.head_is_embedding:
            logits = self.head_matmul(h, self.embed.weight)
        else:
            logits = self.head(h)
        return self.gather_vocab(self.cast(logits, ms.float32))

    def prefill(self, input_ids, batch_valid_length, adapter_ids=None, context=None, mask_position=None):
        """`context`, `mask_position` (B,) int32: GLM's row inputs (None for other families)."""
        x = self._embed(input_ids, self.positions)
        cos, sin = self.cos_prefill, self.sin_prefill
        if self.two_d:
            cos, sin = self._rotary_2d(self.steps_prefill, context, mask_position, (self.batch, 1), (-1,),
                                       (self.batch, 1, self.seq, -1), 0)
        if self.prefix:
            bias = self.bias.prefill(context)
        else:
            bias = self.bias.prefill()
        select = self._select(input_ids, adapter_ids, (self.batch, 1), (-1, 1))
        new_kv = ()
        for layer in self.layers:
            h = layer.attn_norm(x)
            attn, k, v = layer.attn.prefill(h, cos, sin, bias, select)
            x = layer.finish(x, attn, select, h)
            new_kv = new_kv + (k, v)
        if self.use_top_query:
            x, k, v = self.top_query.prefill(self.final_norm(x), self.batch_positions, self.cos_prefill,
                                             self.sin_prefill, bias)
            new_kv = new_kv + (k, v)
        last = self.row_offsets + batch_valid_length - 1
        logits = self._logits(self.gather(self.reshape(x, (self.batch * self.seq, -1)), last, 0))
        return (logits,) + new_kv if self.kv_mode == "io" else logits

    def increment(self, input_ids, batch_valid_length, kv, adapter_ids=None, context=None, mask_position=None):
        pos = self.reshape(batch_valid_length - 1, (self.batch, 1))
        if self.two_d:
            cos, sin = self._rotary_2d(self.cast(pos, ms.float32), context, mask_position, (self.batch, 1), (-1,),
                                       (self.batch, 1, 1, -1), 0)
        else:
            cos = self.cast(self.reshape(self.gather(self.cos_table, pos, 0), (self.batch, 1, 1, -1)), self.dtype)
            sin = self.cast(self.reshape(self.gather(self.sin_table, pos, 0), (self.batch, 1, 1, -1)), self.dtype)
        x = self._embed(input_ids, pos)
        row = self.reshape(self.cast(self.equal(self.positions, pos), ms.float32), (self.batch, 1, self.seq, 1))
        select = self._select(input_ids, adapter_ids, (self.batch, 1), (-1, 1))
        x, new_kv = self._step_layers(x, cos, sin, kv, self.bias.step(pos), select, pos, row)
        logits = self._logits(self.reshape(x, (self.batch, -1)))
        return (logits,) + new_kv if self.kv_mode == "io" else logits

    def _step_layers(self, x, cos, sin, kv, biases, select, positions, row):
        """The layers of a decode step (io, in_graph): `biases` from ScoreBias.step, `row` the one-hot
        of the new rows, `kv` the past K/V per layer (none in_graph), `positions` the tokens' (the top
        query layer's input). Returns the last hidden states and the new K/V rows of every layer."""
        new_kv = ()
        i = 0
        for layer in self.layers:
            h = layer.attn_norm(x)
            k_past, v_past = self._past(kv, i)
            attn, k, v = layer.attn.step(h, cos, sin, k_past, v_past, biases, select, row=row)
            x = layer.finish(x, attn, select, h)
            new_kv = new_kv + (k, v)
            i = i + 1
        if self.use_top_query:
            k_past, v_past = self._past(kv, len(self.layers))
            x, k, v = self.top_query.step(self.final_norm(x), positions, cos, sin, k_past, v_past, biases, row)
            new_kv = new_kv + (k, v)
        return x, new_kv

    def _past(self, kv, i):
        """Layer i's past keys and values: none in_graph (the Parameter caches)."""
        if self.kv_mode == "in_graph":
            return None, None
        return kv[2 * i], kv[2 * i + 1]

    def _rotary_at(self, positions):
        """cos, sin (N, 1, hd) of tokens at `positions` (N,) int32."""
        d = self.dyn
        cos = self.cast(self.reshape(self.gather(self.cos_table, positions, d.axis0), d.per_token), self.dtype)
        sin = self.cast(self.reshape(self.gather(self.sin_table, positions, d.axis0), d.per_token), self.dtype)
        return cos, sin

    def packed_step(self, input_ids, token_rows, token_positions, past_length, last_token, kv, adapter_ids=None,
                    context=None, mask_position=None):
        """N tokens of any rows (the packed kv mode, lite_runtime/contract/families.py): input_ids,
        token_rows, token_positions (N,); past_length and the family's row inputs (B,); last_token (L,)
        the indices of the tokens whose logits are returned; the caches per layer K (B, kv, hd, P) and
        V (B, kv, P, hd), or with the paged store each row's block ids (B, T) and the store's id (1,). Returns the
        logits (L, vocab) and, without the paged store, every token's new K and V (N, kv, hd) per layer."""
        x, cos, sin, tokens, select = self.packed_start(input_ids, token_rows, token_positions, past_length,
                                                        adapter_ids, context, mask_position)
        x, new_kv, biases = self.packed_blocks(self.layers, x, cos, sin, kv, tokens, None, select)
        if self.use_top_query:
            top = 2 * len(self.layers)
            caches = kv if self.paged else (kv[top], kv[top + 1])
            x, k, v = self.packed_top_query(x, token_positions, cos, sin, caches[0], caches[1], tokens, biases,
                                            len(self.layers))
            new_kv = new_kv + (k, v)
        if self.paged:
            return self.packed_logits(x, last_token)
        return (self.packed_logits(x, last_token),) + new_kv

    def packed_start(self, input_ids, token_rows, token_positions, past_length, adapter_ids=None, context=None,
                     mask_position=None):
        """The packed step up to the first layer: the tokens' hidden states (N, H), their cos/sin
        (N, 1, hd), what the attention reads about them (packed.py: ROWS .. CONTEXT) and the SLoRA columns."""
        d, rows = self.dyn, token_rows
        position = self.cast(token_positions, ms.float32)
        if self.two_d:
            cos, sin = self._rotary_2d(position, self.gather(context, rows, d.axis0),
                                       self.gather(mask_position, rows, d.axis0), d.flat, d.flat, d.per_token, d.axis0)
        else:
            cos, sin = self._rotary_at(token_positions)
        x = self._embed(input_ids, token_positions)
        select = None
        if self.lora:
            adapter = self.cast(self.reshape(self.gather(adapter_ids, rows, d.axis0), d.flat_column), ms.float32)
            select = self.cast(self.equal(adapter, self.lora_slot_of_column), self.dtype)
        past = self.reshape(self.cast(self.gather(past_length, rows, d.axis0), ms.float32), d.token_column)
        prefix = self.cast(self.gather(context, rows, d.axis0), ms.float32) if self.prefix else None
        return x, cos, sin, self.with_meta((rows, self.cast(rows, ms.float32), position, past, prefix, None)), select

    def with_meta(self, tokens):
        """`tokens` with META, the attention kernel's table of ROW .. CONTEXT, made once where it is used."""
        if not self.attention_kernel or tokens[META] is not None:
            return tokens
        d, position = self.dyn, tokens[POSITION]
        context = tokens[CONTEXT] if self.prefix else self.ones_like(position) * -1.0
        columns = (tokens[ROW], position, tokens[PAST], context)
        meta = self.concat_columns(tuple(self.reshape(c, d.flat_column) for c in columns))
        return tokens[:META] + (meta,)

    def packed_blocks(self, layers, x, cos, sin, kv, tokens, biases, select, first=0):
        """Blocks `layers` of a packed call (kv: their past K/V pairs, or the paged store's tables and id, whose
        layers from `first` on they are). Returns the hidden states, the blocks' new K/V (none with the paged
        store) and the score biases (made by the first block when `biases` is None)."""
        new_kv, i, tokens = (), 0, self.with_meta(tokens)
        for layer in layers:
            h = layer.attn_norm(x)
            caches = kv if self.paged else (kv[2 * i], kv[2 * i + 1])
            attn, k, v, biases = self.packed_attention(layer.attn, h, cos, sin, caches[0], caches[1], tokens,
                                                       biases, select, layer=first + i)
            x = layer.finish(x, attn, select, h)
            if not self.paged:
                new_kv = new_kv + (k, v)
            i = i + 1
        return x, new_kv, biases

    def packed_top_query(self, x, token_positions, cos, sin, k_cache, v_cache, tokens, biases=None, layer=0):
        """PanGu-alpha's top query layer in a packed call, after the final norm: (output, new K, V); `layer`: its
        layer of the paged store."""
        top = self.top_query
        x = self.final_norm(x)
        attn, k, v, _ = self.packed_attention(top.attn, top.attn_norm(x), cos, sin, k_cache, v_cache, tokens, biases,
                                              None, top.query_embed(token_positions), layer)
        return top.finish(x, attn), k, v

    def packed_logits(self, x, last_token):
        """Logits of the tokens at `last_token` (L,) from the hidden states x (N, H), picked by a product
        with a one-hot (N, L): Lite 2.0 gets a Gather of a graph input by a (1,)-shaped index wrong
        (the head segment at batch 1 gave other logits than MindSpore does from the same MindIR). The
        product is x^T one-hot, transposed: one-hot^T x, with one row when L is 1, is wrong on Lite's
        CPU past 1,500 tokens (attention.Weigh)."""
        d = self.dyn
        tokens = self.cumsum(self.ones_like(self.sum_last(x, -1)), 0) - 1.0            # 0 .. N-1
        pick = self.cast(self.equal(self.reshape(tokens, d.flat_column),
                                    self.reshape(self.cast(last_token, ms.float32), d.row_of_tokens)), self.dtype)
        return self._logits(self.transpose(self.matmul_ta(x, pick), (1, 0)))

    def packed_attention(self, attn, h, cos, sin, k_cache, v_cache, tokens, biases, select, query=None, layer=0):
        """A layer's attention (up to its output projection's reduction) in a packed call, with the
        score biases, made here when `biases` is None."""
        q, k, v = attn.project_tokens(h, cos, sin, select, query)
        if self.attention_kernel:
            meta = self.with_meta(tokens)[META]
            if self.paged:      # k_cache, v_cache: the block tables and the store's id
                o = self.kernel_attend(q, k, v, meta, k_cache, v_cache, self.store_layers[layer])
            else:
                o = self.kernel_attend(q, k, v, k_cache, v_cache, meta)
            return attn.output(o, select), k, v, biases
        s_past, s_new = self.attend.scores(q, k, k_cache, tokens[ROWS])
        if biases is None:
            biases = self.packed_bias(s_past, tokens)
        o = self.attend(s_past + biases[0], s_new + biases[1], v, v_cache, tokens[ROWS])
        return attn.output(o, select), k, v, biases


class Graph(nn.Cell):
    """One exported graph (prefill or increment; PackedGraph: the packed step) with the contract's inputs
    (lite_runtime/contract/families.py), bound by their names in `names`, the contract's order.
    MindSpore 2.0 records construct's argument names as the graph's input names: the leading ones are
    named here, the rest come as `*kv` (recorded kv0, kv1 ...)."""

    def __init__(self, net: CausalLM, kind: str, names):
        super().__init__(auto_prefix=False)
        self.net, self.kind = net, kind
        leading = 1 + len(PACKED_INPUTS) if net.kv_mode == "packed" else 2
        rest = list(names[leading:])
        first_cache = [i for i, n in enumerate(rest) if n.startswith("key_cache_") or n == "block_tables"]
        self.i_cache = first_cache[0] if first_cache else len(rest)
        self.i_context, self.i_mask, self.i_adapter = (rest.index(n) if n in rest else -1 for n in
                                                       ("context_length", "mask_position", "adapter_ids"))

    def construct(self, input_ids, batch_valid_length, *kv):
        return self.bind(input_ids, batch_valid_length, kv)

    def row_args(self, kv):
        """The adapter ids and GLM's context_length and mask_position among the inputs after the
        leading ones (None where the export has none)."""
        context = mask_position = adapter_ids = None
        if self.i_context >= 0:
            context, mask_position = kv[self.i_context], kv[self.i_mask]
        if self.i_adapter >= 0:
            adapter_ids = kv[self.i_adapter]
        return adapter_ids, context, mask_position

    def bind(self, input_ids, batch_valid_length, kv):
        adapter_ids, context, mask_position = self.row_args(kv)
        if self.kind == "prefill":
            return self.net.prefill(input_ids, batch_valid_length, adapter_ids, context, mask_position)
        return self.net.increment(input_ids, batch_valid_length, kv[self.i_cache:], adapter_ids, context,
                                  mask_position)


class PackedGraph(Graph):
    """The packed step's graph: PACKED_INPUTS follow input_ids."""

    def construct(self, input_ids, token_rows, token_positions, past_length, last_token, *kv):
        adapter_ids, context, mask_position = self.row_args(kv)
        return self.net.packed_step(input_ids, token_rows, token_positions, past_length, last_token,
                                    kv[self.i_cache:], adapter_ids, context, mask_position)
