"""The vLLM model classes of diffattn's plugin: diffattn's causal LMs, transformers' DiffLlama and the released Motif
models on vLLM's own layers.

Each class builds the diffattn model its checkpoint describes on the ``meta`` device (no memory, no computation)
and mirrors it with vLLM's layers: the embedding and LM head (vocabulary-parallel), q/k/v as one column-parallel
linear, ``out_proj`` row-parallel, vLLM's RMSNorm and rotary embedding, and one :class:`vllm.attention.Attention`
per layer, so the KV cache is vLLM's paged cache, with continuous batching, prefix caching and chunked prefill as
vLLM schedules them. The differential part is :func:`diffattn.serve.layout.served_attention`: one grouped-query
attention call per layer over keys [K1 ‖ K2] and values V of width 2d (that module's docstring says why). λ forms,
sub-norms and PolyNorm come from the diffattn layers themselves (copied off ``meta``, then loaded), so a served
model computes what the diffattn model computes.

Tensor parallelism shards key/value groups: each rank holds whole groups with their signal and noise heads, the λ
values of its heads and the replicated sub-norm weight. The checkpoint's own tensor names are read; the query rows
are permuted into the served order as they load.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.sequence import IntermediateTensors

from . import check_vllm_version
from .checkpoints import reference_model, to_diffattn_names
from .layout import ServedLayer, copy_module, served_attention, static_lambda

__all__ = ["DiffattnForCausalLM", "DiffLlamaForCausalLM", "MotifForCausalLM"]


class ServedAttention(nn.Module):
    """One attention layer of any served kind, mirroring the diffattn layer ``ref`` (built on ``meta``)."""

    def __init__(self, ref: nn.Module, *, max_position: int, cache_config, quant_config, prefix: str):
        super().__init__()
        self.layout = layout = ServedLayer.of(ref)
        tp, self.rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.tp = tp
        layout.check_parallel(tp)
        if ref.softcap is not None or ref.sliding_window is not None:
            raise ValueError(f"{prefix}: logit soft-capping and sliding windows are not served by diffattn's vLLM "
                             f"plugin (layer has softcap={ref.softcap}, sliding_window={ref.sliding_window}); "
                             f"served: every kind with full causal attention")
        if not ref.causal:
            raise ValueError(f"{prefix}: a causal LM's attention must be causal")
        self.q_residual = bool(getattr(ref, "q_residual", False))
        if self.q_residual and tp > 1:
            raise ValueError(f"{prefix}: the q residual of M-DGSA (q_residual=True) is served with "
                             f"tensor_parallel_size=1 only, got {tp}")
        d = layout.head_dim
        self.q_size = layout.num_heads * d // tp
        self.kv_size = layout.num_kv_heads * d // tp
        # a λ form that reads logits of the tokens (M-DGSA's gate, V2's λ) has its linear layer fused into qkv_proj
        # as a fourth block of outputs: one GEMM per layer instead of two
        form = ref.lambda_fn if layout.head_layout != "single" else None
        self.logits_proj = getattr(form, "logits_proj", None)
        lam_proj = getattr(form, self.logits_proj) if self.logits_proj else None
        self.lam_size = lam_proj.out_features // tp if lam_proj is not None else 0
        self.qkv_bias = ref.q_proj.bias is not None
        self.lam_bias = lam_proj is not None and lam_proj.bias is not None
        sizes = [layout.num_heads * d, layout.num_kv_heads * d, layout.num_kv_heads * d]
        self.qkv_proj = MergedColumnParallelLinear(
            ref.dim, sizes + ([lam_proj.out_features] if lam_proj is not None else []),
            bias=self.qkv_bias or self.lam_bias, quant_config=quant_config, prefix=f"{prefix}.qkv_proj")
        out_width = layout.signal_heads * layout.out_head_size
        self.out_proj = RowParallelLinear(out_width, ref.dim, bias=ref.out_proj.bias is not None,
                                          quant_config=quant_config, prefix=f"{prefix}.out_proj")
        self.rotary = None
        if ref.rotary is not None:
            self.rotary = get_rope(d, max_position=max_position, is_neox_style=ref.rotary.style == "half",
                                   rope_parameters={"rope_type": "default", "rope_theta": float(ref.rotary.base)})
        self.attn = Attention(layout.num_heads // tp, layout.head_size, 1.0 / math.sqrt(d),
                              num_kv_heads=layout.groups // tp, cache_config=cache_config, quant_config=quant_config,
                              prefix=f"{prefix}.attn")
        device = torch.get_default_device()
        self.lambda_fn = copy_module(form, device) if form is not None else None
        if self.logits_proj:
            setattr(self.lambda_fn, self.logits_proj, None)  # its weights live in qkv_proj
        norm = getattr(ref, "diff_norm", None)
        self.diff_norm = copy_module(norm, device) if isinstance(norm, nn.RMSNorm) else None
        self.norm_eps = float(norm.eps) if isinstance(norm, nn.RMSNorm) and norm.eps is not None else 1e-6
        self.out_scale = float(getattr(ref, "out_scale", 1.0))
        self.fixed_lambda = None  # (weight1, λ) of a λ form that does not read the tokens, set by loaded()
        self.norm_weight = None  # the sub-norm's weight × (1 − λ_init), set by loaded()
        order = torch.tensor(layout.query_order())
        self.register_buffer("query_order", order, persistent=False)  # served head → checkpoint head
        self.register_buffer("query_restore", torch.argsort(order), persistent=False)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        layout, d = self.layout, self.layout.head_dim
        qkv, _ = self.qkv_proj(x)
        if self.lam_size:
            q, k, v, z = qkv.split([self.q_size, self.kv_size, self.kv_size, self.lam_size], dim=-1)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q_lin = q
        if self.rotary is not None:
            q, k = self.rotary(positions, q, k)
        if self.lambda_fn is None:
            weight1, lam = 1.0, 0.0
        elif self.lam_size:
            weight1, lam = self.lambda_fn.from_logits(z[None])  # this rank's λ heads
        else:
            weight1, lam = self.fixed_lambda if self.fixed_lambda is not None else self.lambda_fn(x[None])
        out = served_attention(layout, q, k, v, self.attn, weight1=weight1, lam=lam, rank=self.rank, tp=self.tp)
        if self.diff_norm is not None:
            width = layout.out_head_size
            out = F.rms_norm(out.view(out.shape[0], -1, width), (width,), self.norm_weight, self.norm_eps).flatten(1)
        elif self.out_scale != 1.0:  # (1 − λ_init) without a sub-norm (DiffConfig.output_scale="tied")
            out = out * self.out_scale
        out, _ = self.out_proj(out)
        if self.q_residual:  # + X W_Q in the checkpoint's head order, before the rotary embedding
            T = x.shape[0]
            out = out + q_lin.view(T, layout.num_heads, d)[:, self.query_restore].reshape(T, -1)
        return out

    @torch.no_grad()
    def loaded(self) -> None:
        """After the weights are loaded: λ of a form that does not read the tokens, computed once (a reparam λ is a
        function of the weights alone), and the sub-norm's weight with (1 − λ_init) folded in, as
        :func:`diffattn.layers.norm.scaled_rms_norm` folds it."""
        self.fixed_lambda = static_lambda(self.lambda_fn) if self.lambda_fn is not None and not self.lam_size else None
        bias = self.qkv_proj.bias
        if bias is not None and not self.qkv_bias:  # the fused λ logits have a bias, q, k and v have none
            bias[:bias.shape[0] - self.lam_size].zero_()
        elif bias is not None and self.lam_size and not self.lam_bias:
            bias[bias.shape[0] - self.lam_size:].zero_()
        if self.diff_norm is not None:
            w = self.diff_norm.weight
            width = self.layout.out_head_size
            dtype = self.qkv_proj.weight.dtype
            self.norm_weight = (w.to(dtype) * self.out_scale if w is not None else
                                (torch.full((width,), self.out_scale, dtype=dtype, device=self.qkv_proj.weight.device)
                                 if self.out_scale != 1.0 else None))

    def permute_queries(self, t: torch.Tensor) -> torch.Tensor:
        """A checkpoint's q_proj weight (Hq·d, dim) or bias (Hq·d,) → the served head order."""
        d = self.layout.head_dim
        return t.reshape(self.layout.num_heads, d, *t.shape[1:])[self.query_order.cpu()].reshape(t.shape)


class ServedSwiGLU(nn.Module):
    """down(SiLU(gate(x)) ⊙ up(x)) (Llama; diffattn's SwiGLU)."""

    def __init__(self, ref: nn.Module, *, quant_config, prefix: str):
        super().__init__()
        hidden, dim = ref.gate_proj.out_features, ref.gate_proj.in_features
        bias = ref.gate_proj.bias is not None
        self.gate_up_proj = MergedColumnParallelLinear(dim, [hidden] * 2, bias=bias, quant_config=quant_config,
                                                       prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(hidden, dim, bias=bias, quant_config=quant_config,
                                           prefix=f"{prefix}.down_proj")
        self.act = SiluAndMul()

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.act(gate_up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.activate(gate_up))
        return out


class ServedPolyNormGLU(ServedSwiGLU):
    """down(PolyNorm(gate(x)) ⊙ up(x)), the MLP of the Motif models (:class:`diffattn.layers.PolyNormGLU`). The
    normalisations of PolyNorm run over the whole hidden width: under tensor parallelism the sums of squares are
    all-reduced across the ranks that hold its shards."""

    def __init__(self, ref: nn.Module, *, quant_config, prefix: str):
        super().__init__(ref, quant_config=quant_config, prefix=prefix)
        self.act_fn = copy_module(ref.act_fn, torch.get_default_device())
        self.width = ref.gate_proj.out_features
        self.tp = get_tensor_model_parallel_world_size()

    def _norm(self, t: torch.Tensor) -> torch.Tensor:
        sq = t.pow(2).sum(-1, keepdim=True)
        if self.tp > 1:
            sq = tensor_model_parallel_all_reduce(sq)
        return t * torch.rsqrt(sq / self.width + self.act_fn.eps)

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        xf = gate.float() if gate.dtype in (torch.float16, torch.bfloat16) else gate
        w, b = self.act_fn.weight.to(xf.dtype), self.act_fn.bias.to(xf.dtype)
        act = w[0] * self._norm(xf ** 3) + w[1] * self._norm(xf * xf) + w[2] * self._norm(xf) + b
        return act.to(gate.dtype) * up


class ServedBlock(nn.Module):
    """x = x + attn(norm1(x)); x = x + mlp(norm2(x)), with vLLM's fused residual RMSNorm."""

    def __init__(self, ref: nn.Module, *, max_position: int, cache_config, quant_config, prefix: str):
        super().__init__()
        self.norm1 = RMSNorm(ref.norm1.normalized_shape[0], eps=_eps(ref.norm1))
        self.attn = ServedAttention(ref.attn, max_position=max_position, cache_config=cache_config,
                                    quant_config=quant_config, prefix=f"{prefix}.attn")
        self.norm2 = RMSNorm(ref.norm2.normalized_shape[0], eps=_eps(ref.norm2))
        mlp = ServedPolyNormGLU if hasattr(ref.mlp, "act_fn") else ServedSwiGLU
        self.mlp = mlp(ref.mlp, quant_config=quant_config, prefix=f"{prefix}.mlp")

    def forward(self, positions, x, residual):
        if residual is None:
            residual, x = x, self.norm1(x)
        else:
            x, residual = self.norm1(x, residual)
        x = self.attn(positions, x)
        x, residual = self.norm2(x, residual)
        return self.mlp(x), residual


def _eps(norm: nn.Module) -> float:
    return float(norm.eps) if norm.eps is not None else torch.finfo(torch.float32).eps


@support_torch_compile(dynamic_arg_dims={"input_ids": {0: "b"}, "positions": {0: "b"},
                                         "intermediate_tensors": {0: "b"}, "inputs_embeds": {0: "b"}})
class ServedDecoder(nn.Module):
    """Embedding, blocks and final norm: the part vLLM compiles (``torch.compile`` with its piecewise graphs and, on a
    GPU, CUDA graphs) unless ``enforce_eager``."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", ref: nn.Module | None = None):
        super().__init__()
        quant_config = vllm_config.quant_config
        max_position = max(int(ref.max_seq_len), int(vllm_config.model_config.max_model_len))
        self.tok_embed = VocabParallelEmbedding(ref.vocab_size, ref.dim, quant_config=quant_config)
        self.blocks = nn.ModuleList([
            ServedBlock(blk, max_position=max_position, cache_config=vllm_config.cache_config,
                        quant_config=quant_config, prefix=f"{prefix}.blocks.{i}")
            for i, blk in enumerate(ref.blocks)])
        self.norm = RMSNorm(ref.dim, eps=_eps(ref.norm))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.tok_embed(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        x = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)  # (T, D)
        residual = None
        for blk in self.blocks:
            x, residual = blk(positions, x, residual)
        x, _ = self.norm(x, residual)
        return x


class _ServedCausalLM(nn.Module):
    """A diffattn causal LM (:class:`~diffattn.models.CausalLM`, :class:`~diffattn.models.motif.MotifLM`) on
    vLLM's layers. Subclasses say how their checkpoint's config and tensor names read (``layout``: see
    :mod:`diffattn.serve.checkpoints`)."""

    layout = "diffattn"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        check_vllm_version()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.ref = reference_model(self.layout, config.to_dict())  # on meta; not a submodule
        ref = self.ref
        self.model = ServedDecoder(vllm_config=vllm_config, prefix=f"{prefix}.model" if prefix else "model", ref=ref)
        self.lm_head = ParallelLMHead(ref.vocab_size, ref.dim, quant_config=vllm_config.quant_config,
                                      prefix=f"{prefix}.lm_head" if prefix else "lm_head")
        if ref.tie_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.tok_embed)
        self.logits_processor = LogitsProcessor(ref.vocab_size)
        self.make_empty_intermediate_tensors = None

    def __setattr__(self, name, value):
        if name == "ref":  # the meta reference is kept out of the module tree (its tensors are not served)
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    # ------------------------------------------------------------------------------------------ weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Read the checkpoint's tensors under their own names (mapped to diffattn's by the subclass's layout),
        strictly: a name the model does not hold, or a tensor of the reference model that the checkpoint lacks, is
        a ValueError naming it."""
        params = dict(self.named_parameters())
        buffers = dict(self.named_buffers())
        expected = set(self.ref.state_dict())
        if self.ref.tie_embeddings:
            expected.discard("lm_head.weight")
        seen: set[str] = set()
        loaded: set[str] = set()
        for name, tensor in to_diffattn_names(self.layout, self.ref, weights):
            if self.ref.tie_embeddings and name == "lm_head.weight":
                continue  # the embedding's, written twice by some savers
            if name not in expected:
                raise ValueError(f"the checkpoint holds {name!r} (diffattn name), which this model has no place for")
            seen.add(name)
            target, shard, tensor = self._target(name, tensor)
            target = target if target.startswith("lm_head.") else f"model.{target}"
            if target in params:
                p = params[target]
                loader = getattr(p, "weight_loader", default_weight_loader)
                loader(p, tensor) if shard is None else loader(p, tensor, shard)
                loaded.add(target)
            elif target in buffers:
                buffers[target].copy_(tensor)
            else:  # pragma: no cover - a name map out of step with the served modules
                raise ValueError(f"no served tensor for {name!r} ({target!r})")
        missing = sorted(expected - seen)
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} tensor(s) of the model: {missing[:6]}")
        if self.ref.tie_embeddings:
            loaded.add("lm_head.weight")
        for blk in self.model.blocks:
            blk.attn.loaded()
        return loaded

    def _target(self, name: str, tensor: torch.Tensor) -> tuple[str, int | None, torch.Tensor]:
        """diffattn name → (served parameter, shard of a merged linear or None, tensor in the served layout)."""
        head, _, leaf = name.rpartition(".")
        parts = name.split(".")
        if len(parts) > 3 and parts[0] == "blocks" and parts[2] == "attn":
            i, rest = int(parts[1]), ".".join(parts[3:])
            base = f"blocks.{i}.attn"
            proj, _, kind = rest.partition(".")
            if proj in ("q_proj", "k_proj", "v_proj") and kind in ("weight", "bias"):
                if proj == "q_proj":
                    tensor = self.model.blocks[i].attn.permute_queries(tensor)
                return f"{base}.qkv_proj.{kind}", ("q_proj", "k_proj", "v_proj").index(proj), tensor
            if rest in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2") or rest.startswith("gate_proj."):
                rest = f"lambda_fn.{rest}"  # the flat checkpoint names of the λ forms
            attn = self.model.blocks[i].attn
            if attn.logits_proj and rest.startswith(f"lambda_fn.{attn.logits_proj}."):
                return f"{base}.qkv_proj.{rest.rpartition('.')[2]}", 3, tensor  # fused into qkv_proj
            if rest.startswith("lambda_fn."):
                return f"{base}.{rest}", None, tensor
            return name, None, tensor
        if len(parts) > 3 and parts[0] == "blocks" and parts[2] == "mlp" and parts[3] in ("gate_proj", "up_proj"):
            return f"blocks.{parts[1]}.mlp.gate_up_proj.{leaf}", ("gate_proj", "up_proj").index(parts[3]), tensor
        return name, None, tensor


class DiffattnForCausalLM(_ServedCausalLM):
    """A causal LM saved by diffattn (``save_pretrained``, ``diffattn train``): standard, differential (V1),
    gated (M-DGSA), V2 or grouped attention, SwiGLU or PolyNorm MLP (:class:`~diffattn.models.motif.MotifLM`)."""

    layout = "diffattn"


class DiffLlamaForCausalLM(_ServedCausalLM):
    """transformers' ``DiffLlamaForCausalLM`` (halves head layout, read into diffattn's adjacent one)."""

    layout = "diffllama"


class MotifForCausalLM(_ServedCausalLM):
    """The released Motif decoders: Motif-2.6B (differential attention) and Motif-2-12.7B (grouped differential
    attention at any signal:noise ratio, from ``num_noise_heads`` in ``config.json``)."""

    layout = "motif"
