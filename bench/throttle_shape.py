"""How a quota shapes a throttle, measured: the plots in README's "What a throttle looks like".

A single-node Kafka (harness), the proxy with examples/demo.yaml's quota (1 MiB/s for client id
demo-producer, Kafka's default window of 11 samples of 1 s), and the demo producer sending as fast as it can
for ``--seconds``. Every acknowledgement is traced; the plot shows the rate in 0.5 s bins, the rate over the
last 11 s (what Kafka's quota compares), the quota, and the cumulative bytes against the bound quota x (t + 11 s).

``--enforcement smooth`` runs the same producer against ``quotas.enforcement: smooth`` (a bucket of
``smooth_burst_seconds`` 0.1 s of quota paces each Produce) and draws that mode's bound, quota x (t + 0.1 s),
beside Kafka's: the picture of issue 30's item 1, the same long-run rate without the bursts and the silences.

    .venv/bin/python -m bench.throttle_shape --seconds 60 --out docs/throttle-shape.png
    .venv/bin/python -m bench.throttle_shape --seconds 60 --enforcement smooth   # docs/throttle-shape-smooth.png
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import KafkaCluster
from tests.support import ProxyProcess

REPO = Path(__file__).resolve().parents[1]
QUOTA = 1 << 20
WINDOW_S = 11.0
SMOOTH_BURST_S = 0.1


def proxy_extra(enforcement: str) -> dict:
    """The proxy's config: the demo's quota, enforced the way ``enforcement`` says."""
    extra: dict = {
        "quotas.enforcement": enforcement,
        "quotas.entities": [{"entity": {"client-id": "demo-producer"}, "quotas": {"producer_byte_rate": QUOTA}}],
    }
    if enforcement == "smooth":
        extra["quotas.smooth_burst_seconds"] = SMOOTH_BURST_S
    return extra


def _trace(seconds: float, workdir: Path, enforcement: str) -> list[tuple[float, int]]:
    with KafkaCluster(1) as cluster:
        proxy = ProxyProcess(workdir, cluster.bootstrap, extra=proxy_extra(enforcement)).start()
        try:
            trace = workdir / "trace.csv"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "scripts.demo_producer",
                    "--bootstrap-server",
                    proxy.bootstrap,
                    "--quota",
                    str(QUOTA),
                    "--seconds",
                    str(seconds),
                    "--trace",
                    str(trace),
                    "--enforcement",  # the summary's bound is the mode's
                    enforcement,
                    "--burst-seconds",
                    str(SMOOTH_BURST_S),
                ],
                cwd=REPO,
                check=True,
                timeout=seconds + 180,
            )
        finally:
            proxy.terminate()
    with trace.open() as f:
        return [(float(r["t_s"]), int(r["acked_bytes"])) for r in csv.DictReader(f)]


def _cum_at(points: list[tuple[float, int]], t: float) -> int:
    got = 0
    for ts, b in points:
        if ts > t:
            break
        got = b
    return got


def _plot(points: list[tuple[float, int]], out: Path, enforcement: str) -> list[tuple[float, float, float]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = points[-1][0]
    bins = [i * 0.5 for i in range(int(end / 0.5) + 1)]
    cum = [_cum_at(points, t) for t in bins]
    rate = [(cum[i] - cum[i - 1]) / 0.5 / QUOTA for i in range(1, len(bins))]
    windowed = [
        (cum[i] - cum[max(0, i - int(WINDOW_S / 0.5))]) / min(bins[i], WINDOW_S) / QUOTA if bins[i] > 0 else 0.0
        for i in range(1, len(bins))
    ]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    top.step(bins[1:], rate, where="post", lw=0.8, label="acknowledged, 0.5 s bins")
    smooth = enforcement == "smooth"
    top.plot(bins[1:], windowed, lw=1.5, label="rate over the last 11 s (what Kafka's quota compares)")
    top.axhline(1.0, color="k", ls="--", lw=1, label="quota: 1 MiB/s")
    top.set_ylabel("MiB/s")
    # kafka mode: the bursts set the scale; smooth: room above the quota so the bins' spread stays visible
    top.set_ylim(0, max(2.0, min(max(rate) * 1.05, 12)))
    top.legend(loc="upper right", fontsize=8)
    top.set_title(
        "A producer at full speed under a 1 MiB/s quota, through the proxy "
        + (f"(enforcement: smooth, burst {SMOOTH_BURST_S:g} s)" if smooth else "(Kafka's default window)")
    )
    bottom.plot(bins, [c / (1 << 20) for c in cum], label="acknowledged, cumulative")
    bottom.plot(
        bins,
        [(t + WINDOW_S) for t in bins],
        "k--",
        lw=1,
        label="Kafka's bound: quota x (t + 11 s)" if smooth else "bound: quota x (t + 11 s)",
    )
    if smooth:
        bottom.plot(
            bins,
            [(t + SMOOTH_BURST_S) for t in bins],
            "r--",
            lw=1,
            label=f"smooth's bound: quota x (t + {SMOOTH_BURST_S:g} s)",
        )
    bottom.plot(bins, bins, "k:", lw=1, label="quota x t")
    bottom.set_xlabel("seconds since the producer started")
    bottom.set_ylabel("MiB")
    bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    # the table: the burst at the start, then each saw-tooth's burst (a bin over twice the quota)
    rows, last = [], -10.0
    for t, r in zip(bins[1:], rate, strict=True):
        if r > 2.0 and t - last > 3.0:
            rows.append((t, r, _cum_at(points, t) / (1 << 20)))
            last = t
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument(
        "--enforcement",
        choices=("kafka", "smooth"),
        default="kafka",
        help="the proxy's quotas.enforcement (default kafka, Kafka's own semantics)",
    )
    ap.add_argument("--out", type=Path, help="default docs/throttle-shape.png (kafka), docs/throttle-shape-smooth.png")
    args = ap.parse_args()
    out = args.out or REPO / "docs" / (
        "throttle-shape-smooth.png" if args.enforcement == "smooth" else "throttle-shape.png"
    )
    with tempfile.TemporaryDirectory(prefix="ktp-shape-") as tmp:
        t0 = time.monotonic()
        points = _trace(args.seconds, Path(tmp), args.enforcement)
    rows = _plot(points, out, args.enforcement)
    end, total = points[-1]
    bound_s = SMOOTH_BURST_S if args.enforcement == "smooth" else WINDOW_S
    print(
        f"enforcement {args.enforcement}; load average {os.getloadavg()[0]:.1f}; run {time.monotonic() - t0:.0f} s; "
        f"plot: {out}"
    )
    print(
        f"acked {total / (1 << 20):.1f} MiB in {end:.1f} s = {total / end / QUOTA:.2f} x quota on average; "
        f"bound quota x (t + {bound_s:g} s) = {(end + bound_s):.1f} MiB"
    )
    print("| burst starts at (s) | 0.5 s rate (MiB/s) | acknowledged so far (MiB) |\n|---:|---:|---:|")
    for t, r, c in rows:
        print(f"| {t:.1f} | {r:.1f} | {c:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
