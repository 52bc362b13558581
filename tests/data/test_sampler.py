"""The public data position (``titan.data.ResumableSampler``): exact resume, world-size re-split,
prefetch never commits (``commit="advance"``), a running ``for`` loop follows a restore or a
rollback (``commit="draw"``), mid-epoch resume with ``set_epoch``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from titan.data import ResumableSampler

N, B = 50, 4  # 50 is no multiple of any global batch used: batches straddle epochs


class _Ids(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def _consume(samplers: list[ResumableSampler], steps: int, accum: int = 1) -> list[int]:
    """Run ``steps`` optimizer steps on all ranks of one world; return the samples in stream order."""
    its = [iter(s) for s in samplers]
    seen: list[int] = []
    for _ in range(steps):
        for _ in range(accum):
            for it in its:  # rank order = slice order of the global batch
                seen.extend(next(it) for _ in range(B))
        for s in samplers:
            s.advance(accum * s.global_batch)
    return seen


def _world(n: int, state: dict | None = None, seed: int = 7) -> list[ResumableSampler]:
    ss = [ResumableSampler(N, B, seed=seed, rank=r, world_size=n, commit="advance") for r in range(n)]
    if state is not None:
        for s in ss:
            s.load_state_dict(state)
    return ss


def test_stream_covers_each_epoch_exactly_once() -> None:
    s = ResumableSampler(N, B, seed=3)
    assert sorted(s.stream(0, N)) == list(range(N))
    assert sorted(s.stream(N, N)) == list(range(N))
    assert s.stream(0, N) != s.stream(N, N), "epochs 0 and 1 have the same order"


@pytest.mark.parametrize("cut", [0, 1, 6, 7, 13])
def test_resume_at_any_step_continues_the_exact_sequence(cut: int) -> None:
    full = _consume(_world(2), 13)
    first = _world(2)
    head = _consume(first, cut)
    state = first[0].state_dict()
    assert all(s.state_dict() == state for s in first), "sampler state differs across ranks"
    tail = _consume(_world(2, state), 13 - cut)
    assert head + tail == full, f"resume at step {cut}: sequence differs from the uninterrupted one"


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2), (2, 3)])
def test_world_size_change_drops_and_duplicates_nothing(before: int, after: int) -> None:
    ref = ResumableSampler(N, B, seed=7)
    first = _world(before)
    seen = _consume(first, 5, accum=2)
    state = first[0].state_dict()
    assert state["consumed"] == 5 * 2 * before * B
    seen += _consume(_world(after, state), 7)
    total = len(seen)
    assert seen == ref.stream(0, total), f"{before}->{after}: consumed samples are not the global stream prefix"
    # Within each epoch-sized window every sample appears exactly once.
    for e in range(total // N):
        window = seen[e * N:(e + 1) * N]
        assert sorted(window) == list(range(N)), f"epoch {e}: duplicates or gaps after re-split"


def test_prefetching_workers_do_not_move_the_committed_position() -> None:
    s = ResumableSampler(N, B, seed=5, rank=1, world_size=2, commit="advance")
    loader = DataLoader(_Ids(), batch_size=B, sampler=s, num_workers=2, prefetch_factor=4,
                        generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    got = []
    for _ in range(3):
        got.append(next(it).tolist())
        s.advance(s.global_batch)
    state = s.state_dict()
    del it
    assert state["consumed"] == 3 * 2 * B, f"expected 24 committed samples, saw {state['consumed']}"
    resumed = ResumableSampler(N, B, seed=5, rank=1, world_size=2, commit="advance")
    resumed.load_state_dict(state)
    nxt = next(iter(DataLoader(_Ids(), batch_size=B, sampler=resumed, num_workers=0))).tolist()
    expected = ResumableSampler(N, B, seed=5).stream(3 * 2 * B + B, B)  # rank 1's slice of batch 4
    assert nxt == expected, f"after resume rank 1 read {nxt}, expected {expected}"
    assert got[0] == ResumableSampler(N, B, seed=5).stream(B, B)


def test_state_of_another_seed_is_refused() -> None:
    s = ResumableSampler(N, B, seed=1)
    with pytest.raises(ValueError, match="seed 2"):
        s.load_state_dict(ResumableSampler(N, B, seed=2).state_dict())


def test_global_rng_is_untouched_by_sampling() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    s = ResumableSampler(N, B, seed=9)
    s.stream(0, 3 * N)
    assert torch.equal(before, torch.get_rng_state()), "the sampler consumed the global RNG (dropout would shift)"


def _loader(s: ResumableSampler) -> DataLoader:
    return DataLoader(_Ids(), batch_size=B, sampler=s)


def test_a_for_loop_over_the_loader_resumes_exactly_without_any_call():
    """``commit="draw"``: the position a checkpoint saves is what the loop has drawn."""
    full = [b.tolist() for _, b in zip(range(20), _loader(ResumableSampler(N, B, seed=4, rank=0, world_size=1)))]
    first = ResumableSampler(N, B, seed=4, rank=0, world_size=1)
    head = [b.tolist() for _, b in zip(range(7), _loader(first))]
    resumed = ResumableSampler(N, B, seed=4, rank=0, world_size=1)
    resumed.load_state_dict(first.state_dict())
    tail = [b.tolist() for _, b in zip(range(13), _loader(resumed))]
    assert head + tail == full, "the resumed loop read other batches than the uninterrupted one"


def test_a_running_loop_follows_a_rollback_of_the_position():
    s = ResumableSampler(N, B, seed=4, rank=0, world_size=1)
    it = iter(_loader(s))
    seen = [next(it).tolist() for _ in range(3)]
    saved = s.state_dict()  # as after step 3 (a snapshot)
    seen += [next(it).tolist() for _ in range(2)]
    s.load_state_dict(saved)  # the guard rolls back to step 3: the same iterator goes on from there
    again = [next(it).tolist() for _ in range(2)]
    assert again == seen[3:5], f"after the rollback the loop read {again}, expected {seen[3:5]}"


def test_an_epoch_loop_resumes_mid_epoch_with_its_code_unchanged():
    def run(sampler: ResumableSampler, stop_after: int | None = None) -> list[list[int]]:
        out: list[list[int]] = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for batch in _loader(sampler):
                out.append(batch.tolist())
                if stop_after is not None and len(out) == stop_after:
                    return out
        return out

    full = run(ResumableSampler(_Ids(), B, seed=2, rank=0, world_size=1))
    assert len(full) == 3 * (N // B), "each epoch is N // B full batches (the tail is dropped)"
    first = ResumableSampler(_Ids(), B, seed=2, rank=0, world_size=1)
    head = run(first, stop_after=17)  # epoch 1, batch 5
    resumed = ResumableSampler(_Ids(), B, seed=2, rank=0, world_size=1)
    resumed.load_state_dict(first.state_dict())
    tail = run(resumed)  # the same loop, from epoch 0: epoch 0 yields nothing, epoch 1 goes on
    assert head + tail == full, "the resumed epoch loop read other batches than the uninterrupted one"


def test_rank_and_world_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    s = ResumableSampler(_Ids(), B, seed=0)
    assert (s.rank, s.world_size, s.num_samples) == (1, 2, N)
    first = next(iter(s))  # rank 1 reads the second slice of the first global batch
    assert first == ResumableSampler(N, B, seed=0, rank=0, world_size=1).stream(B, 1)[0], first
