"""Reading a Prometheus text page (the gateway's ``/metrics``) in the benchmarks."""

from __future__ import annotations

__all__ = ["histogram_buckets"]


def histogram_buckets(metrics_text: str, name: str) -> dict[float, float]:
    """Histogram ``name``'s buckets: upper bound (``+Inf`` as ``inf``) -> cumulative count,
    summed over label sets other than ``le``."""
    out: dict[float, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_bucket") and 'le="' in line:
            le = float(line.split('le="', 1)[1].split('"', 1)[0])  # float() reads "+Inf"
            out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return dict(sorted(out.items()))
