"""``Population``: P variants of one architecture (seeds × learning rates) as one model whose
parameters are stacked ``[P, *]``, so one forward and one backward train all of them.

The variants share the architecture, so only the modules that hold parameters differ from
``HybridModel``'s: each is swapped for a population twin that applies variant p's parameters to
variant p's rows. Activations keep the model's own layout with the population folded into the
batch, ``[P·B, T, d]``, variant-major, so the mixers (attention, linear attention, rotary
positions, the short convolution) run unchanged. Variant p of a population built from models
``m_0..m_{P-1}`` computes what ``m_p`` computes (to rounding: batched matmuls may sum in another
order), and ``variant(p)`` gives it back as a ``HybridModel``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from nas.models.hybrid import HybridModel

__all__ = ["Population"]


class _PopLinear(nn.Module):
    """P ``nn.Linear`` s: weight ``[P, out, in]``, bias ``[P, out]``; x ``[P·B, ..., in]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        P = self.weight.shape[0]
        rows = x.reshape(P, -1, x.shape[-1])  # [P, B·..., in]
        if self.bias is None:
            out = torch.bmm(rows, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), rows, self.weight.transpose(1, 2))
        return out.reshape(*x.shape[:-1], self.weight.shape[1])


class _PopNorm(nn.Module):
    """P LayerNorms or RMSNorms over the last dim: weight (and LayerNorm's bias) ``[P, d]``."""

    def __init__(self, norm: nn.LayerNorm | nn.RMSNorm, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.layer = isinstance(norm, nn.LayerNorm)
        self.eps = norm.eps
        self.shape = tuple(norm.normalized_shape)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer:
            y = F.layer_norm(x, self.shape, eps=self.eps)
        else:
            y = F.rms_norm(x, self.shape, eps=self.eps)
        P, d = self.weight.shape
        rows = y.reshape(P, -1, d) * self.weight.unsqueeze(1)
        if self.bias is not None:
            rows = rows + self.bias.unsqueeze(1)
        return rows.reshape(x.shape)


class _PopEmbedding(nn.Module):
    """P embedding tables ``[P, V, d]``; tokens ``[P·B, T]`` look up their variant's table."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        P, V, d = self.weight.shape
        offset = torch.arange(P, device=tokens.device).repeat_interleave(tokens.shape[0] // P) * V
        return F.embedding(tokens + offset.view(-1, *([1] * (tokens.dim() - 1))), self.weight.reshape(P * V, d))


class _PopConv(nn.Module):
    """P depthwise causal convolutions: ``weight [P, C, 1, K]``, ``bias [P, C]``. The mixers pass
    them to ``causal_depthwise_conv``, which reads a leading population dim."""

    def __init__(self, conv: nn.Conv1d, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.kernel_size = conv.kernel_size
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)


def _twin(module: nn.Module, models: list[nn.Module], name: str) -> nn.Module | None:
    """The population twin of ``module`` (found at ``name`` in each of ``models``), or None when
    it holds no parameters of its own."""

    def stacked(attr: str) -> torch.Tensor | None:
        if getattr(module, attr, None) is None:
            return None
        return torch.stack([getattr(m.get_submodule(name), attr).detach() for m in models]).clone()

    if isinstance(module, nn.Linear):
        return _PopLinear(stacked("weight"), stacked("bias"))
    if isinstance(module, nn.LayerNorm | nn.RMSNorm):
        return _PopNorm(module, stacked("weight"), stacked("bias"))
    if isinstance(module, nn.Embedding):
        return _PopEmbedding(stacked("weight"))
    if isinstance(module, nn.Conv1d):
        return _PopConv(module, stacked("weight"), stacked("bias"))
    assert not list(module.parameters(recurse=False)), f"{type(module).__name__} has no population twin"
    return None


class Population(nn.Module):
    """P ``HybridModel`` s of one architecture trained as one: tokens ``[P·B, T]`` (variant p's
    rows are ``p·B .. p·B + B - 1``) → the logits of each row from its variant, ``[P·B, T, n_out]``
    (or ``[P·B, n_out]``). Every parameter is ``[P, *]``, as ``OptimizerBase.population`` steps them."""

    def __init__(self, models: list[HybridModel]) -> None:
        super().__init__()
        assert models and all(m.arch == models[0].arch for m in models), "a population shares one architecture"
        self.size = len(models)
        self.arch = models[0].arch
        self.net = copy.deepcopy(models[0])
        for name, module in list(self.net.named_modules()):
            twin = _twin(module, models, name) if name else None
            if twin is not None:
                parent, _, attr = name.rpartition(".")
                self.net.get_submodule(parent).register_module(attr, twin)
        names = {n for n, _ in self.net.named_parameters()}
        assert names == {n for n, _ in models[0].named_parameters()}, "every parameter has its twin"

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens)

    def variant(self, p: int) -> HybridModel:
        """Variant ``p`` as a plain ``HybridModel`` (its own copy of the weights)."""
        with torch.random.fork_rng(devices=[]):  # its initialisation is overwritten: leave the global RNG be
            model = HybridModel(self.arch)
        model.load_state_dict({k: v[p].detach().clone() for k, v in self.net.state_dict().items()})
        return model.to(next(self.parameters()).device)
