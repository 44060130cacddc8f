"""lm-evaluation-harness model ``diffattn``: the library's causal LMs and retrofitted Hugging Face models on any
lm-eval task (DAA (2025) §5 reports the common-sense suite through it).

Importing this module changes nothing in lm-eval: :func:`register` puts the model in lm-eval's registry. From the
shell, ``diffattn lm-eval`` registers it, then runs lm-eval's own command line with the same arguments::

    diffattn lm-eval --model diffattn --model_args pretrained=runs/lm --tasks lambada_openai
    diffattn lm-eval --model diffattn --model_args base=path/to/gpt2,adapter=runs/daa/adapter --tasks hellaswag

From Python: ``diffattn.eval.lm_harness.register()`` and then ``lm_eval.simple_evaluate(model="diffattn", ...)``.

model_args: ``pretrained`` (a diffattn ``save_pretrained`` folder or a training run directory) or ``base`` (a
Hugging Face causal LM folder/name) with optional ``adapter`` (a :func:`diffattn.save_adapter` folder);
``tokenizer`` (``gpt2``, ``bytes`` or a Hugging Face tokenizer; see :mod:`diffattn.eval.text_models`),
``max_length`` (context window; default the model's), ``device``, ``dtype`` (``float32``, ``bfloat16``,
``float16``).

Scoring: ``loglikelihood`` sums log p(continuation | context) over the continuation's tokens (context truncated
on the left to fit) and reports whether greedy decoding would produce it; ``loglikelihood_rolling`` scores every
token of a document after an end-of-text prefix (a newline for the byte tokenizer) with the windows of
:func:`diffattn.eval.language.perplexity`; ``generate_until`` decodes greedily (with the KV cache for diffattn
models) until a stop string or ``max_gen_toks``.
"""

from __future__ import annotations

import sys

import lm_eval.models  # noqa: F401  (registers lm-eval's own models before ours, so the registry is complete)
import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from .language import perplexity
from .text_models import lm_logits, load_language_model

__all__ = ["DiffattnLM", "register", "main"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DiffattnLM(LM):
    """lm-eval ``LM`` over a diffattn causal LM or a (retrofitted) Hugging Face causal LM (module docstring)."""

    def __init__(self, pretrained: str | None = None, base: str | None = None, adapter: str | None = None,
                 tokenizer: str | None = None, max_length: int | None = None, device: str | None = None,
                 dtype: str = "float32", batch_size: int | str | None = 1, max_batch_size: int | None = None,
                 max_gen_toks: int = 256, **kwargs):
        super().__init__()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if kwargs:
            raise TypeError(f"unknown model_args for the diffattn model: {sorted(kwargs)}")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, self.tok, model_max = load_language_model(pretrained, base=base, adapter=adapter,
                                                              tokenizer=tokenizer, device=device,
                                                              dtype=_DTYPES[dtype])
        self.max_length = int(max_length) if max_length is not None else model_max
        self.max_gen_toks = int(max_gen_toks)
        self._device = torch.device(device)
        prefix = self.tok.eot if self.tok.eot is not None else self.tok.encode("\n")[0]
        self.prefix_id = int(prefix)

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return self.tok.name

    # ---------------------------------------------------------------------------------------------- scoring
    @torch.no_grad()
    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        ids = (context + continuation)[-(self.max_length + 1):]
        inp = torch.tensor([ids[:-1]], device=self._device)
        logp = F.log_softmax(lm_logits(self.model, inp)[0, -len(continuation):].double(), dim=-1)  # (C, V)
        target = torch.tensor(continuation, device=self._device)
        ll = logp.gather(1, target[:, None]).sum().item()
        return ll, bool((logp.argmax(-1) == target).all())

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        for req in tqdm(requests, desc="loglikelihood", disable=disable_tqdm):
            context, continuation = req.args
            # a trailing space of the context belongs to the continuation (lm-eval's convention for BPE)
            n_space = len(context) - len(context.rstrip(" "))
            if n_space:
                context, continuation = context[:-n_space], context[-n_space:] + continuation
            ctx = self.tok.encode(context) if context else [self.prefix_id]
            cont = self.tok.encode(continuation)
            if not cont:
                raise ValueError(f"continuation must encode to at least one token, got {continuation!r}")
            out.append(self._score(ctx, cont))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in tqdm(requests, desc="loglikelihood_rolling", disable=disable_tqdm):
            (text,) = req.args[:1]
            ids = torch.tensor([self.prefix_id] + self.tok.encode(text))
            r = perplexity(self.model, ids, context_length=self.max_length)
            out.append(-r["nll"] * r["tokens"])
        return out

    @torch.no_grad()
    def _greedy(self, ids: list[int], until: list[str], max_new: int) -> str:
        ids = ids[-max(1, self.max_length - max_new):]
        caches = self.model.new_kv_caches() if hasattr(self.model, "new_kv_caches") else None
        new = torch.tensor([ids], device=self._device)
        seq: list[int] = []
        for _ in range(max_new):
            if caches is not None:
                logits = self.model(new, None, caches)[:, -1]
            else:
                logits = lm_logits(self.model, torch.tensor([ids + seq], device=self._device))[:, -1]
            nxt = int(logits.argmax(-1))
            if self.tok.eot is not None and nxt == self.tok.eot:
                break
            seq.append(nxt)
            new = torch.tensor([[nxt]], device=self._device)
            text = self.tok.decode(seq)
            if any(u and u in text for u in until):
                break
        text = self.tok.decode(seq)
        for u in until:
            if u and u in text:
                text = text[:text.index(u)]
        return text

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in tqdm(requests, desc="generate_until", disable=disable_tqdm):
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
            if gen_kwargs.get("do_sample") or float(gen_kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError(f"the diffattn lm-eval model decodes greedily; got sampling arguments {gen_kwargs}")
            ctx = self.tok.encode(context) if context else [self.prefix_id]
            out.append(self._greedy(ctx, until, max_new))
        return out


def register() -> None:
    """Put :class:`DiffattnLM` in lm-eval's model registry as ``diffattn`` (idempotent)."""
    from lm_eval.api.registry import MODEL_REGISTRY

    if MODEL_REGISTRY.get("diffattn", None) is not DiffattnLM:
        register_model("diffattn")(DiffattnLM)


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with the ``diffattn`` model registered (``diffattn lm-eval ARGS``)."""
    from lm_eval.__main__ import cli_evaluate

    register()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()

