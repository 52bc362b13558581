"""tinygpt's model: sizes of the presets, causality, dropout and per-rank seeding."""

from __future__ import annotations

import torch

from titan.workloads.tinygpt import GPT, PRESETS, GPTConfig, MarkovCorpus
from titan.workloads.tinygpt.rng import rank_seed, seed_everything


def test_presets_have_the_promised_sizes() -> None:
    tiny = GPT(PRESETS["tiny"]).num_params()
    assert 300_000 < tiny < 700_000, f"tiny preset has {tiny:,} params, expected ~0.5M"
    big = PRESETS["100m"]
    # Counted analytically (building it costs ~200 MB and seconds).
    d, v, t, n = big.d_model, big.vocab_size, big.seq_len, big.n_layer
    params = v * d + t * d + n * (12 * d * d + 13 * d) + 2 * d
    assert 50e6 <= params <= 100e6, f"100m preset has {params:,} params, expected 50–100M"
    assert PRESETS["tiny"].dropout > 0 and big.dropout > 0


def test_model_is_causal() -> None:
    torch.manual_seed(0)
    m = GPT(GPTConfig(dropout=0.0)).eval()
    x = torch.randint(256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.equal(a[0, :10], b[0, :10]), "changing future tokens changed earlier logits"
    assert not torch.equal(a[0, 10:], b[0, 10:])


def test_dropout_differs_across_ranks_but_repeats_per_rank() -> None:
    assert rank_seed(0, 0) != rank_seed(0, 1) != rank_seed(1, 0)
    draws = {}
    for rank in (0, 1, 0):
        seed_everything(5, rank)
        draws.setdefault(rank, []).append(torch.nn.functional.dropout(torch.ones(64), 0.5))
    assert torch.equal(draws[0][0], draws[0][1]), "same (seed, rank) gave different dropout masks"
    assert not torch.equal(draws[0][0], draws[1][0]), "ranks 0 and 1 drew the same dropout mask"


def test_corpus_is_deterministic_and_sparse() -> None:
    a, b = MarkovCorpus(64, 16, num_samples=32, seed=1), MarkovCorpus(64, 16, num_samples=32, seed=1)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, MarkovCorpus(64, 16, num_samples=32, seed=2).tokens)
    x, y = a[3]
    assert torch.equal(x[1:], y[:-1])
    assert a.entropy_nats() < 0.5 * a.uniform_nats()
