"""Read vLLM's Prometheus ``/metrics`` text into ``EngineStats``."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rollyard.engines.base import EngineStats


def parse_vllm_metrics(text: str) -> EngineStats:
    """Sum each metric over its label sets (one engine may report several model labels)."""
    values: dict[str, float] = {}
    kv_capacity = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if name == "vllm:cache_config_info":
                size = s.labels.get("kv_cache_size_tokens")
                if size and size.isdigit():
                    kv_capacity = int(size)
                elif s.labels.get("num_gpu_blocks") and s.labels.get("block_size"):
                    kv_capacity = int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"])
                continue
            values[name] = values.get(name, 0.0) + float(s.value)
    return EngineStats(
        kv_capacity_tokens=kv_capacity,
        kv_usage=min(1.0, max(0.0, values.get("vllm:kv_cache_usage_perc", 0.0))),
        running=int(values.get("vllm:num_requests_running", 0)),
        waiting=int(values.get("vllm:num_requests_waiting", 0)),
        preemptions=int(values.get("vllm:num_preemptions_total", values.get("vllm:num_preemptions", 0))),
        prefix_cache_hits=int(
            values.get("vllm:prefix_cache_hits_total", values.get("vllm:prefix_cache_hits", 0))
        ),
        prefix_cache_queries=int(
            values.get("vllm:prefix_cache_queries_total", values.get("vllm:prefix_cache_queries", 0))
        ),
        prefill_tokens=int(values.get("vllm:request_prefill_kv_computed_tokens_sum", 0)),
        prefill_s=values.get("vllm:request_prefill_time_seconds_sum", 0.0),
    )
