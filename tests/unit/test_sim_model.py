"""The trace model's pure parts (``python -m bench.sim model``): SHARDS sampling of chunk
ids, and a node's store driving LOTA's real S3-FIFO and admission rule."""

from __future__ import annotations

import numpy as np

from bench.sim.model_replay import NodeCache
from bench.sim.model_workload import CHUNK, sampled
from lota.testing.cachesim import epochs


def _ids(family: int, objects: int, chunks: int, rate: float) -> set[tuple[int, int]]:
    obj, idx = sampled(family, objects, chunks, rate)
    return set(zip(obj.tolist(), idx.tolist(), strict=True))


def test_sampling_keeps_about_rate_of_the_chunks_spread_over_the_objects() -> None:
    objects, chunks, rate = 10_000, 100, 1 / 64
    obj, idx = sampled(1, objects, chunks, rate)
    expected = objects * chunks * rate  # 15,625; one standard deviation is about 124
    assert abs(len(obj) - expected) < 5 * expected**0.5
    assert obj.min() >= 0 and obj.max() < objects and idx.min() >= 0 and idx.max() < chunks
    assert len(np.unique(obj)) > 0.7 * objects  # chunks, not whole objects, are sampled
    assert list(obj * chunks + idx) == sorted(obj * chunks + idx)


def test_a_lower_rate_keeps_a_subset_of_a_higher_one_and_the_same_chunks_every_time() -> None:
    low, high = _ids(3, 2000, 50, 1 / 256), _ids(3, 2000, 50, 1 / 32)
    assert low and low < high
    assert _ids(3, 2000, 50, 1 / 32) == high
    assert _ids(4, 2000, 50, 1 / 32) != high  # another family: other chunks


def test_sampling_does_not_depend_on_how_many_objects_follow() -> None:
    # A dataset that grows (ingest) keeps the chunks it had.
    before = _ids(5, 1000, 10, 1 / 16)
    after = _ids(5, 3000, 10, 1 / 16)
    assert before == {c for c in after if c[0] < 1000}


def _epoch_hit_rate(admission: bool) -> float:
    """Hit rate from the second of five epochs over 1,000 chunks, half of them fitting."""
    cache = NodeCache(500 * CHUNK, [CHUNK] * 1000, ghost_min=1024, admission=admission)
    hits = reads = 0
    for epoch, chunk in epochs(1000, 5):
        hit = chunk in cache
        if hit:
            cache.hit(chunk, CHUNK)
        else:
            cache.fill(chunk, CHUNK)
        assert cache.usage <= cache.high
        if epoch:
            hits += hit
            reads += 1
    return hits / reads


def test_a_node_store_runs_lotas_admission_rule_in_front_of_s3fifo() -> None:
    # The admission rule keeps the first epoch's chunks (about the share of the dataset
    # below the high watermark); S3-FIFO alone churns (lota/cache/admission.py).
    with_rule, s3fifo_alone = _epoch_hit_rate(True), _epoch_hit_rate(False)
    assert with_rule > 0.4
    assert s3fifo_alone < 0.3
