"""InterFormerArch: GEM's interaction arch, Wukong and the sequence pyramid.

With `model.experimental.interleave`, following InterFormer (Zeng et al., arXiv 2411.09852), the
non-sequential arch (Wukong layers over the feature embeddings) and the sequence arch (the jagged
attention pyramid) exchange summaries at every layer instead of meeting once at the top:

    layer i:  cls_i, m_i = NonSeqSummary_i(X_i)               # X_i [B, n_i, D]; m_i the PFFN's message
              S_{i+1}, c_i = SequenceLayer_i(S_i, cls_i, m_i)    # S jagged [L_i, Ds]
              s_i = SequenceSummary_i(S_{i+1}, c_i)              # [B, n_s, D], gated
              X_{i+1} = Wukong_i(concat(X_i, s_i))

The output is flatten(X_last) ++ flatten(s_last). By default (no interleaving, since the events'
match rows made the exchange level: docs/MODEL.md) the pyramid runs with learned CLS tokens and no
personalisation, and its summary joins only at the top; `SequenceConfig.match_candidate` marks each
event whose attributes equal the target ad's. Ablations (ModelConfig): `use_wukong=False` swaps each
Wukong layer for an MLP layer of the same output shape; `use_sequence=False` drops the pyramid and adds
the mean-pooled sequence as one more embedding. Kunlun's parts (the PFFN as GDPA, seed pooling, sliding
windows, Computation Skip, Wukong experts) are research options in `model.experimental`, each off.
"""

from __future__ import annotations

import torch
from torch import nn

from gem_model.config import FeatureSpec, ModelConfig
from gem_model.modules.mlp import mlp
from gem_model.modules.sequence import (
    SequenceLayer,
    SequenceSummary,
    SequenceTokenizer,
    pyramid_max_lengths,
    summary_tokens,
)
from gem_model.modules.sparse_arch import SparseOutput
from gem_model.modules.wukong import wukong_layer


class MLPLayer(nn.Module):
    """The `use_wukong=False` stand-in: LN(MLP(flatten X) + residual), n_in -> n_out embeddings."""

    def __init__(self, n_in: int, n_out: int, dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.n_out, self.dim = n_out, dim
        self.mlp = mlp(n_in * dim, hidden, n_out * dim)
        self.residual = nn.Linear(n_in * dim, n_out * dim, bias=False) if n_in != n_out else None
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        residual = x if self.residual is None else self.residual(flat).view(-1, self.n_out, self.dim)
        return self.norm(self.mlp(flat).view(-1, self.n_out, self.dim) + residual)


class NonSeqSummary(nn.Module):
    """X [B, n, D] -> (CLS tokens [B, C, Ds], the PFFN's message): the non-sequential side's message is a
    low-rank gate [B, r], or for a GDPA PFFN the flattened X [B, n·D] it makes its keys and values from."""

    def __init__(self, n_in: int, dim: int, config: ModelConfig) -> None:
        super().__init__()
        seq, experimental = config.sequence, config.experimental
        self.n_cls, self.seq_dim = seq.n_cls, seq.dim
        self.cls = nn.Linear(n_in * dim, seq.n_cls * seq.dim)
        self.gate = nn.Linear(n_in * dim, experimental.pffn_rank) if experimental.pffn == "lowrank" else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.flatten(1)
        return self.cls(flat).view(-1, self.n_cls, self.seq_dim), flat if self.gate is None else self.gate(flat)


class InterFormerArch(nn.Module):
    def __init__(self, spec: FeatureSpec, config: ModelConfig, n_features: int) -> None:
        super().__init__()
        self.config = config
        d, seq, experimental = config.embedding_dim, config.sequence, config.experimental
        n_layers = len(seq.pyramid)
        self.max_lengths = pyramid_max_lengths(spec, seq)
        n_summary = summary_tokens(seq, experimental) if config.use_sequence else 0
        n_out = config.wukong.n_fm + config.wukong.n_lc
        self.interleaved = config.use_sequence and experimental.interleave
        joins_each_layer = n_summary if self.interleaved else 0
        n_ins = [n_features + (0 if config.use_sequence else 1)] + [n_out] * (n_layers - 1)
        self.interaction = nn.ModuleList(
            [
                wukong_layer(n + joins_each_layer, d, config.wukong, experimental.wukong_experts)
                if config.use_wukong
                else MLPLayer(n + joins_each_layer, n_out, d, config.wukong.mlp_dims)
                for n in n_ins
            ]
        )
        if config.use_sequence:
            self.tokenizer = SequenceTokenizer(spec, d, seq.dim, seq.match_candidate)
            # Computation Skip: the first, third, ... layers skip self-attention and pool a fresh summary; the
            # others attend and reuse the summary pooled just before.
            skips = [experimental.comp_skip and i % 2 == 0 for i in range(n_layers)]
            self.sequence = nn.ModuleList(
                [
                    SequenceLayer(
                        seq, experimental, keep, personalised=self.interleaved, context_dim=n * d, attends=not skip
                    )
                    for keep, n, skip in zip(seq.pyramid, n_ins, skips)
                ]
            )
            # Interleaved: a summary per layer; otherwise one, of the last layer, joined at the top.
            if self.interleaved:
                self.summaries = nn.ModuleList(
                    [
                        SequenceSummary(
                            seq, experimental, d, max_len=n, pools=not (experimental.comp_skip and i % 2 == 1)
                        )
                        for i, n in enumerate(self.max_lengths)
                    ]
                )
                self.messages = nn.ModuleList([NonSeqSummary(n, d, config) for n in n_ins])
            else:
                self.summaries = nn.ModuleList([SequenceSummary(seq, experimental, d, max_len=self.max_lengths[-1])])
                self.cls = nn.Parameter(torch.randn(seq.n_cls, seq.dim) * 0.02)
        self.out_dim = (n_out + n_summary) * d

    def forward(self, x: torch.Tensor, sparse: SparseOutput) -> torch.Tensor:
        """x [B, F, D] feature embeddings -> [B, out_dim]."""
        if not self.config.use_sequence:
            x = torch.cat([x, sparse.seq_mean.unsqueeze(1)], dim=1)
            for layer in self.interaction:
                x = layer(x)
            return x.flatten(1)
        tokens = self.tokenizer(sparse.seq_values, sparse.seq_side)
        lengths, b = sparse.seq_lengths, x.shape[0]
        if self.tokenizer.match:
            tokens = tokens + self.tokenizer.candidate_match(sparse.seq_side, sparse.candidate_side, lengths)
        pooled = None
        for i, seq_layer in enumerate(self.sequence):
            if self.interleaved:
                cls, message = self.messages[i](x)
            else:
                cls, message = self.cls.expand(b, -1, -1), None
            level_lengths = lengths
            tokens, lengths, cls_out, level = seq_layer(tokens, lengths, self.max_lengths[i], cls, message)
            if self.interleaved:
                summary, pooled = self.summaries[i](tokens, lengths, cls_out, level, level_lengths, pooled)
                x = self.interaction[i](torch.cat([x, summary], dim=1))
        if not self.interleaved:
            for layer in self.interaction:
                x = layer(x)
            summary, _ = self.summaries[0](tokens, lengths, cls_out, level, level_lengths)
        return torch.cat([x.flatten(1), summary.flatten(1)], dim=1)
