"""Hit rates of what the cache keeps, under training epochs and under Zipf: LRU, S3-FIFO
alone (the store before its admission rule), and S3-FIFO with the admission rule.

    python -m bench.admission [--chunks 20000] [--epochs 5] [--zipf-chunks 100000]
                              [--zipf-reads 1000000] [--watermarks 0.95,0.90]

It runs :mod:`lota.testing.cachesim`: the store's own policy classes over a byte budget
with the store's watermarks, chunks of one size, fixed seeds (the same figures every run).

- Epochs: `--chunks` chunks read whole `--epochs` times, each epoch in a new random order;
  the hit rate from the second epoch on, for budgets of 0.1 .. 0.9 of the dataset.
- Zipf: `--zipf-reads` reads over `--zipf-chunks` chunks (the first fifth warms the
  cache), for a few skews (alpha) and budgets of 1% and 10% of the chunks.
- Switch: a dataset read for 3 epochs, then another of the same size: the hit rate of each
  epoch of the second, with half of it cached (how soon a finished dataset makes way).
- Workers: epochs again, the store being a chunk owner's among N workers: the others
  serve their hits from descriptors they keep and tell the owner of them every 1,000
  reads (told), or never (untold, as before they told): budgets of 0.5 and 0.9.
- Mixed: epochs with half the dataset cached, and 50 small files read as often as the
  dataset, in turns: the hit rates of the dataset (epochs 2..) and of the small files.
"""

from __future__ import annotations

import argparse

from lota.testing.cachesim import (
    POLICIES,
    SimulatedCache,
    epoch_hit_rate,
    epochs,
    zipf_hit_rate,
)

FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ALPHAS = (0.6, 0.8, 1.0, 1.2)


def epoch_table(chunks: int, count: int, watermarks: tuple[float, float]) -> None:
    print(f"Epochs: {chunks} chunks, {count} epochs, hit rate of epochs 2..{count}")
    print(f"{'cache/dataset':>14} " + " ".join(f"{p:>10}" for p in POLICIES))
    for fraction in FRACTIONS:
        rates = [epoch_hit_rate(p, chunks, fraction, count, watermarks) for p in POLICIES]
        print(f"{fraction:>14.1f} " + " ".join(f"{r:>10.3f}" for r in rates), flush=True)


def zipf_table(chunks: int, reads: int, watermarks: tuple[float, float]) -> None:
    print(f"\nZipf: {reads} reads over {chunks} chunks, hit rate after the first fifth")
    print(f"{'alpha':>6} {'cache':>6} {'s3fifo':>10} {'admission':>10} {'diff':>8}")
    for alpha in ALPHAS:
        for fraction in (0.01, 0.1):
            plain, kept = (
                zipf_hit_rate(p, chunks, fraction, alpha, reads, watermarks)
                for p in ("s3fifo", "admission")
            )
            print(
                f"{alpha:>6.1f} {fraction:>6.0%} {plain:>10.3f} {kept:>10.3f}"
                f" {kept - plain:>+8.3f}",
                flush=True,
            )


def switch_table(chunks: int, watermarks: tuple[float, float]) -> None:
    print(f"\nSwitch: 3 epochs of dataset A, then B ({chunks} chunks each, half cached)")
    print(f"{'policy':>10} " + " ".join(f"{'B' + str(e + 1):>6}" for e in range(6)))
    for policy in POLICIES:
        cache = SimulatedCache(chunks // 2, policy, *watermarks)
        for _, chunk in epochs(chunks, 3, seed=9, first=chunks):
            cache.read(chunk)
        hits = [0] * 6
        for epoch, chunk in epochs(chunks, 6):
            hits[epoch] += cache.read(chunk)
        print(f"{policy:>10} " + " ".join(f"{h / chunks:>6.3f}" for h in hits), flush=True)


def mixed_table(chunks: int, count: int, watermarks: tuple[float, float]) -> None:
    print(f"\nMixed: {count} epochs over {chunks} chunks, half cached, and 50 small files")
    print(f"{'policy':>10} {'dataset':>8} {'files':>8}")
    for policy in POLICIES:
        cache = SimulatedCache(chunks // 2, policy, *watermarks)
        dataset = files = reads = 0
        for n, (epoch, chunk) in enumerate(epochs(chunks, count)):
            hit = cache.read(chunk)
            hot = cache.read(10 * chunks + n * 7 % 50)
            if epoch > 0:
                dataset, files, reads = dataset + hit, files + hot, reads + 1
        print(f"{policy:>10} {dataset / reads:>8.3f} {files / reads:>8.3f}", flush=True)


def workers_table(chunks: int, count: int, watermarks: tuple[float, float]) -> None:
    print(f"\nWorkers: {count} epochs over {chunks} chunks, siblings' hits told every 1,000 reads")
    print(f"{'workers':>8} {'half told':>10} {'untold':>8} {'0.9 told':>10} {'untold':>8}")
    for workers in (1, 2, 8, 64):
        rates = []
        for fraction in (0.5, 0.9):
            for told in (1000, None):
                budget = int(fraction * chunks)
                cache = SimulatedCache(budget, "admission", *watermarks, workers, told)
                hits = reads = 0
                for epoch, chunk in epochs(chunks, count):
                    hit = cache.read(chunk)
                    if epoch > 0:
                        hits, reads = hits + hit, reads + 1
                rates.append(hits / reads)
        widths = (10, 8, 10, 8)
        print(
            f"{workers:>8} " + " ".join(f"{r:>{w}.3f}" for r, w in zip(rates, widths, strict=True)),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--zipf-chunks", type=int, default=100_000)
    parser.add_argument("--zipf-reads", type=int, default=1_000_000)
    parser.add_argument("--watermarks", default="0.95,0.90", help="high,low")
    args = parser.parse_args()
    high, low = (float(w) for w in args.watermarks.split(","))
    epoch_table(args.chunks, args.epochs, (high, low))
    zipf_table(args.zipf_chunks, args.zipf_reads, (high, low))
    switch_table(args.chunks, (high, low))
    mixed_table(args.chunks, args.epochs, (high, low))
    workers_table(args.chunks, args.epochs, (high, low))


if __name__ == "__main__":
    main()
