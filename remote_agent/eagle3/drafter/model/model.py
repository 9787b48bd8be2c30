"""The EAGLE-3 drafter, in one file: the model SGLang 0.5.23 serves, written for training.

Two attention flavours behind one layout (chosen by `architectures` in the config dict, which
is exactly the config.json the exporter writes):

* `LlamaForCausalLMEagle3` (sglang/srt/models/llama_eagle3.py): GQA attention with neox RoPE.
* `Eagle3DeepseekV2ForCausalLM` (sglang/srt/models/kimi_k25_eagle3.py): DeepSeek multi-latent
  attention (q_a/q_b low-rank query, kv_a compressed KV + shared rotary key, kv_b expansion),
  interleaved (GPT-J) RoPE on the rotary dims.

Data flow of one draft step (identical in SGLang and here):

    g        = fc(concat(aux_1..aux_K))                  (step 0 only; K target layers)
    x        = concat(input_layernorm(embed(token)), hidden_norm(g))      width 2H
    residual = g + attn(x)                               (attention input is 2H wide)
    out      = residual + mlp(post_attention_layernorm(residual))   = pre-norm hidden
    logits   = lm_head(norm(out))                        (draft vocabulary)
    next g   = out (or norm(out) when norm_output)

The embedding is the target's and stays frozen (SGLang replaces the draft embedding with the
target's at load). `d2t[i]` maps draft id i to target id i + d2t[i]; `t2d` marks target ids
that are in the draft vocabulary.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from remote_agent.eagle3.drafter.model.memory import SharedCasts

LLAMA_ARCH = "LlamaForCausalLMEagle3"
MLA_ARCH = "Eagle3DeepseekV2ForCausalLM"


def build_config(
    drafter: Any,
    *,
    target_hidden: int,
    vocab_size: int,
    draft_vocab_size: int,
    aux_layer_ids: list[int],
    target_context: int,
) -> dict[str, Any]:
    """The drafter's config dict = the SGLang config.json (DrafterSection -> resolved numbers).

    aux_layer_ids are the capture layers the drafter is trained on (input-of-layer convention);
    eagle_config gets the ids that make SGLang capture exactly those (its +1 rule).
    target_context is the target's context length (drafter/model/context.py): the default and the floor
    of max_position_embeddings. RoPE is plain (rope_scaling null) in training and export alike.
    """
    from remote_agent.eagle3.drafter.model.contract import config_ids_for

    hidden = drafter.hidden_size or target_hidden
    heads = drafter.num_attention_heads
    max_pos = drafter.max_position_embeddings or target_context
    if max_pos < target_context:
        raise ValueError(
            f"drafter.max_position_embeddings is {max_pos} but the target's context length is "
            f"{target_context}; SGLang refuses a drafter shorter than its target (use null)"
        )
    inter = drafter.intermediate_size or int(math.ceil(hidden * 8 / 3 / 64) * 64)
    common = {
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": drafter.rms_norm_eps,
        "rope_theta": drafter.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_pos,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": target_hidden,
        "tie_word_embeddings": False,
        "bias": False,
        "fc_norm": bool(drafter.fc_norm),
        "norm_output": bool(drafter.norm_output),
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": config_ids_for(list(aux_layer_ids)),
            "use_aux_hidden_state": True,
        },
    }
    if drafter.arch == "llama":
        kv = drafter.num_key_value_heads or heads
        head_dim = drafter.head_dim or hidden // heads
        return {
            "architectures": [LLAMA_ARCH],
            "model_type": "llama",
            **common,
            "num_key_value_heads": kv,
            "head_dim": head_dim,
        }
    return {
        "architectures": [MLA_ARCH],
        "model_type": "deepseek_v3",
        **common,
        "num_key_value_heads": heads,
        "q_lora_rank": drafter.q_lora_rank,
        "kv_lora_rank": drafter.kv_lora_rank,
        "qk_nope_head_dim": drafter.qk_nope_head_dim,
        "qk_rope_head_dim": drafter.qk_rope_head_dim,
        "v_head_dim": drafter.v_head_dim,
        "rope_interleave": True,
    }


def num_aux(config: dict[str, Any]) -> int:
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return len(ids) if ids else 3


# ---------------------------------------------------------------------------------------------
# building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., dim/2] (fp32) for integer positions."""
    inv = 1.0 / (
        theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    )
    ang = positions.float().unsqueeze(-1) * inv
    return ang.cos(), ang.sin()


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama style: rotate the two halves. x [B, heads, L, d]; cos/sin [B, L, d/2]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek style (rope_interleave, SGLang is_neox_style=False): rotate (x[2i], x[2i+1]) pairs."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2).to(x.dtype)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, _ = x.shape
    return x.view(b, t, heads, -1).transpose(1, 2)  # [B, heads, L, d]


class LlamaAttention(nn.Module):
    """Projections of SGLang's LlamaAttention with a 2H-wide input (q/k/v), neox RoPE."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        h, self.heads, self.kv_heads = (
            c["hidden_size"],
            c["num_attention_heads"],
            c["num_key_value_heads"],
        )
        self.head_dim = c["head_dim"]
        self.theta = c["rope_theta"]
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.scale = self.head_dim**-0.5

    def in_projs(self) -> list[nn.Linear]:
        """The projections of the 2H-wide layer input (DecoderLayer.pre_parts splits them)."""
        return [self.q_proj, self.k_proj, self.v_proj]

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        return self.qkv_from([p(x) for p in self.in_projs()], positions)

    def qkv_from(self, parts: list[torch.Tensor], positions: torch.Tensor):
        """q, k, v from the in_projs outputs."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)
        qp, kp, vp = parts
        q = rope_neox(_split_heads(qp, self.heads), cos, sin)
        k = rope_neox(_split_heads(kp, self.kv_heads), cos, sin)
        v = _split_heads(vp, self.kv_heads)
        return q, k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class MLAAttention(nn.Module):
    """DeepSeek multi-latent attention in its unabsorbed (training) form, 2H-wide input."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        h, self.heads = c["hidden_size"], c["num_attention_heads"]
        self.nope, self.rope = c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        self.v_dim, self.kv_lora = c["v_head_dim"], c["kv_lora_rank"]
        self.theta = c["rope_theta"]
        eps = c["rms_norm_eps"]
        self.q_a_proj = nn.Linear(2 * h, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], eps)
        self.q_b_proj = nn.Linear(
            c["q_lora_rank"], self.heads * (self.nope + self.rope), bias=False
        )
        self.kv_a_proj_with_mqa = nn.Linear(2 * h, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.heads * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v_dim, h, bias=False)
        self.head_dim = self.nope + self.rope
        self.kv_heads = self.heads
        self.scale = self.head_dim**-0.5

    def in_projs(self) -> list[nn.Linear]:
        """The projections of the 2H-wide layer input (DecoderLayer.pre_parts splits them)."""
        return [self.q_a_proj, self.kv_a_proj_with_mqa]

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        return self.qkv_from([p(x) for p in self.in_projs()], positions)

    def qkv_from(self, parts: list[torch.Tensor], positions: torch.Tensor):
        """q, k, v from the in_projs outputs."""
        qa, kva = parts
        cos, sin = rope_cos_sin(positions, self.rope, self.theta)
        q = _split_heads(self.q_b_proj(self.q_a_layernorm(qa)), self.heads)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        latent, k_pe = kva.split([self.kv_lora, self.rope], dim=-1)
        kv = _split_heads(self.kv_b_proj(self.kv_a_layernorm(latent)), self.heads)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_pe = rope_interleaved(k_pe.unsqueeze(1), cos, sin)  # one rotary key shared by all heads
        q = torch.cat([q_nope, rope_interleaved(q_pe, cos, sin)], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, self.heads, -1, -1)], dim=-1)
        return q, k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """The one EAGLE-3 layer, split around attention so the TTT kernel can sit in between."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        h, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.self_attn = MLAAttention(c) if c["architectures"][0] == MLA_ARCH else LlamaAttention(c)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = MLP(h, c["intermediate_size"])

    def pre(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor):
        """-> q [B, heads, L, d], k, v [B, kv_heads, L, d|dv], residual [B, L, H]."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        q, k, v = self.self_attn.qkv(x, positions)
        return q, k, v, hidden

    # The input projections split by input half: W x = W_e input_layernorm(embeds) +
    # W_h hidden_norm(hidden). A TTT step's embeddings are the shifted rows of one sequence
    # (model.StepInputs), so the embedding half is one matmul per unroll over its L + steps
    # rows (embed_parts), each step adding its rows to its hidden half (pre_parts).

    def embed_parts(self, embeds: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        """W_e input_layernorm(embeds) for each input projection (weights: their W_e)."""
        e = self.input_layernorm(embeds)
        return [F.linear(e, w) for w in weights]

    def pre_parts(
        self,
        hidden: torch.Tensor,
        parts: list[torch.Tensor],
        positions: torch.Tensor,
        weights: list[torch.Tensor],
    ):
        """pre() from the embedding halves of the input projections (`parts`, this step's rows
        of embed_parts) and their hidden halves' weights W_h."""
        h = self.hidden_norm(hidden)
        outs = [e + F.linear(h, w) for e, w in zip(parts, weights, strict=True)]
        q, k, v = self.self_attn.qkv_from(outs, positions)
        return q, k, v, hidden

    def post(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attention output [B, heads, L, dv] -> pre-norm hidden [B, L, H]."""
        residual = residual + self.self_attn.out(attn)
        return residual + self.mlp(self.post_attention_layernorm(residual))


class StepInputs:
    """The input embeddings of every TTT step, from one [B, L + steps, H] tensor `ext` (the
    embeddings of data.step_tokens: the packed ids, then token 0 for the positions past the
    end, as data.step_targets pads): step k at position t reads token t+1+k, i.e. row 1+k+t.
    Every step's rows are a view of `ext`, so an unroll makes one lookup (or none: the loader
    gathers `ext` on the host, data.Loader) instead of one [L, H] copy per step that each step
    kept for backward."""

    def __init__(self, ext: torch.Tensor) -> None:
        self.ext = ext

    def step(self, k: int, n: int) -> torch.Tensor:
        if self.ext.shape[1] < n + k + 1:
            raise ValueError(
                f"step inputs cover {self.ext.shape[1]} rows; step {k} needs {n + k + 1}"
            )
        return self.ext[:, 1 + k : 1 + k + n]


class Eagle3Drafter(nn.Module):
    # buffers (register_buffer) and what training records for export, declared for the checker
    d2t: torch.Tensor
    t2d: torch.Tensor
    num_target_layers: int
    capture_layer_ids: list[int]

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        c = config
        h, th = c["hidden_size"], c["target_hidden_size"]
        self.k_aux = num_aux(c)
        self.embed_tokens = nn.Embedding(c["vocab_size"], h)
        # SGLang swaps in the target embedding unless the widths differ: then it is trained.
        self.embed_tokens.weight.requires_grad_(h != th)
        self.fc_norm = (
            nn.ModuleList(RMSNorm(th, c["rms_norm_eps"]) for _ in range(self.k_aux))
            if c.get("fc_norm")
            else None
        )
        self.fc = nn.Linear(self.k_aux * th, h, bias=bool(c.get("bias")))
        self.midlayer = DecoderLayer(c)
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        self.lm_head = nn.Linear(h, c["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(c["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c["vocab_size"], dtype=torch.bool))
        self.norm_output = bool(c.get("norm_output"))

    # -- setup ---------------------------------------------------------------------------

    def init_weights(self, std: float, generator: torch.Generator | None = None) -> None:
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in name or "layernorm" in name:
                nn.init.ones_(p)
            elif name != "embed_tokens.weight" or p.requires_grad:
                with torch.no_grad():
                    p.normal_(0.0, std, generator=generator)

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, in draft order."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    # -- the pieces of a draft step ------------------------------------------------------

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [B, L, K*Ht] -> g [B, L, H] (optionally per-chunk RMSNorm first, EAGLE-3.1)."""
        if self.fc_norm is not None:
            chunks = aux.chunk(self.k_aux, dim=-1)
            aux = torch.cat([n(ch) for n, ch in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux)

    def next_hidden(self, out: torch.Tensor) -> torch.Tensor:
        return self.norm(out) if self.norm_output else out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))

    # -- training-time test --------------------------------------------------------------

    def step_inputs(self, tokens: torch.Tensor) -> StepInputs:
        """StepInputs from the ids of one packed sequence plus its pad ([B, L + steps]:
        data.step_tokens): one embedding lookup for the whole unroll."""
        return StepInputs(self.embed_tokens(tokens))

    def ttt(
        self,
        aux: torch.Tensor,
        step_ids: list[torch.Tensor] | StepInputs,
        positions: torch.Tensor,
        attention,
        steps: int,
        rows: torch.Tensor | None = None,
        checkpoint: bool = False,
        casts: SharedCasts | None = None,
        hidden0: torch.Tensor | None = None,
        embed_once: bool = False,
    ):
        """Unroll `steps` draft steps over a packed sequence; returns the pre-norm outputs.

        step_ids[k] holds the input tokens of step k ([B, L]: token t+1+k at position t), each
        embedded in its step; or StepInputs: every step's embeddings as views of one lookup.
        `attention(q, k0, v0, ks, vs)` lets the step-k query at position t see the step-0 keys
        at positions <= t of its document plus the keys of steps 1..k at position t itself,
        exactly what the query of draft step k sees in SGLang's chain.

        rows: positions (increasing) that steps >= 1 run on (B = 1; the attention was built with
        the same rows). A position's later steps depend on no other position's, so those rows get
        exactly the values of the full unroll; outputs of steps >= 1 then have len(rows) rows.

        checkpoint: activation checkpointing per TTT step (long sequences): a step keeps its
        output, key and value; everything inside it is recomputed during backward.

        casts: the layer's matrices cast once for the whole unroll (memory.SharedCasts, made for
        `steps` uses) and shared by its steps, instead of once per step and call (autocast under
        torch.compile keeps a copy per step for backward). Gradients still reach the fp32 masters
        per step and accumulate there in fp32, as with autocast.

        hidden0: project(aux) already made (a shard of a long sequence: shards.py); aux unused.

        embed_once (with StepInputs): the embedding half of the layer's input projections is
        one matmul over the L + steps rows (DecoderLayer.embed_parts), each step adding its
        rows to its hidden half (pre_parts): the same sums with 6 of 7 embedding-half matmuls
        (forward and backward) fewer, 12 % of the step's FLOPs at the Kimi shape. casts must
        then be made with split=True (memory.unroll_casts) or be None.
        """
        from remote_agent.eagle3.drafter.model.memory import input_halves

        hidden = self.project(aux) if hidden0 is None else hidden0
        parts = None
        if embed_once and isinstance(step_ids, StepInputs):
            parts = self.midlayer.embed_parts(
                step_ids.ext, input_halves(self.midlayer, casts, "embed")
            )
        k0 = v0 = None
        ks: list[torch.Tensor] = []
        vs: list[torch.Tensor] = []
        outs = []
        n = positions.shape[1]
        for k in range(steps):
            pos_k = positions
            ids_k: torch.Tensor | tuple[torch.Tensor, ...]
            if parts is not None:  # this step's rows of the embedding halves
                ids_k = tuple(StepInputs(x).step(k, n) for x in parts)
            elif isinstance(step_ids, StepInputs):
                ids_k = step_ids.step(k, n)
            else:
                ids_k = step_ids[k]
            if k > 0 and rows is not None:
                pos_k = pos_k[:, rows]
                ids_k = (
                    tuple(x[:, rows] for x in ids_k) if isinstance(ids_k, tuple) else ids_k[:, rows]
                )
                if k == 1:
                    hidden = hidden[:, rows]
            if checkpoint:  # keep only the step's outputs; its insides are recomputed in backward
                from torch.utils.checkpoint import checkpoint as ckpt

                out, kk, vv = ckpt(
                    self._step, hidden, ids_k, pos_k + k, attention, k0, v0, tuple(ks), tuple(vs),
                    casts, use_reentrant=False,
                )  # fmt: skip
            else:
                out, kk, vv = self._step(hidden, ids_k, pos_k + k, attention, k0, v0, ks, vs, casts)
            if k == 0:
                k0, v0 = kk, vv
            else:
                ks.append(kk)
                vs.append(vv)
            outs.append(out)
            hidden = self.next_hidden(out)
        return outs

    def _step(self, hidden, tokens, positions, attention, k0, v0, ks, vs, casts=None):
        """One draft step -> (pre-norm output, this step's key, value); step 0 when k0 is None.
        tokens: the step's input ids, their embeddings (StepInputs), or its rows of the input
        projections' embedding halves (a tuple: ttt's embed_once). casts: the layer's shared
        low-precision matrices (memory.SharedCasts) or None."""
        from remote_agent.eagle3.drafter.model.memory import input_halves, layer_weights

        layer = self.midlayer
        # per step its own SharedCastCols nodes: each step's gradient reaches the fp32 sum alone
        halves = input_halves(layer, casts, "hidden") if isinstance(tokens, tuple) else []
        with layer_weights(layer, casts):
            if isinstance(tokens, tuple):
                q, kk, vv, residual = layer.pre_parts(hidden, list(tokens), positions, halves)
            else:
                emb = tokens if tokens.is_floating_point() else self.embed_tokens(tokens)
                q, kk, vv, residual = layer.pre(hidden, emb, positions)
            if k0 is None:
                k0, v0 = kk, vv
            else:
                ks, vs = [*ks, kk], [*vs, vv]
            return layer.post(attention(q, k0, v0, ks, vs), residual), kk, vv

    # -- inference: one chain of draft tokens --------------------------------------------

    @torch.no_grad()
    def draft_chain(
        self, aux: torch.Tensor, ids: torch.Tensor, steps: int, cache: dict | None = None
    ) -> list[int]:
        """Greedy chain of `steps` draft tokens (target ids) after a verified context.

        aux [T, K*Ht]: target aux states of tokens 0..T-1; ids [T+1]: those tokens plus the
        newest (bonus) token. Plain full attention per step: an independent restatement of
        what `ttt` computes, used by the evaluator and to test the TTT kernel.

        cache: the evaluator's per-prompt dict. Position t's step-0 key and value depend only on
        aux[t] and ids[t+1], which never change once verified (the context only grows), so they
        are kept and only the new positions run; the chain needs the last query only.
        """
        layer, attn = self.midlayer, self.midlayer.self_attn
        t = aux.shape[0]
        dtype = self.fc.weight.dtype
        lo = 0 if cache is None else cache.get("n", 0)
        hidden = self.project(aux[lo:].to(dtype).unsqueeze(0))
        positions = torch.arange(lo, t, device=aux.device).unsqueeze(0)
        emb = self.embed_tokens(ids[1 + lo :].unsqueeze(0))
        q, k0, v0, residual = layer.pre(hidden, emb, positions)
        if cache is None:
            mask = torch.ones(t, t, dtype=torch.bool, device=aux.device).tril()
            o = _attend(q, k0, v0, attn.scale, mask)
            out = layer.post(o, residual)[:, -1:]
        else:
            if lo:
                k0 = torch.cat([cache["k0"], k0], dim=2)
                v0 = torch.cat([cache["v0"], v0], dim=2)
            cache.update(n=t, k0=k0, v0=v0)
            o = _attend(q[:, :, -1:], k0, v0, attn.scale, None)  # the last query sees all
            out = layer.post(o, residual[:, -1:])
        keys, values = [k0], [v0]
        # the tokens stay on the device until the chain ends: one host sync per chain, not one
        # per draft step (the GPU demo's evaluate waited on each)
        draft_ids = self.draft_ids()
        later = torch.arange(t, t + steps, device=aux.device)  # the drafts' positions
        drafts: list[torch.Tensor] = []
        for k in range(steps):
            token = draft_ids[self.logits(out)[0, -1].argmax()]
            drafts.append(token)
            if k == steps - 1:
                break
            emb = self.embed_tokens(token.view(1, 1))
            q, kk, vv, residual = layer.pre(self.next_hidden(out), emb, later[k].view(1, 1))
            keys.append(kk)
            values.append(vv)
            o = _attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), attn.scale, None)
            out = layer.post(o, residual)
        return torch.stack(drafts).tolist() if drafts else []


def _attend(q, k, v, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    """Plain softmax attention (fp32) with GQA expansion; mask [Lq, Lk] bool or None."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)
