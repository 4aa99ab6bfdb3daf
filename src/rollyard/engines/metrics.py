"""Read vLLM's Prometheus ``/metrics`` text into ``EngineStats``; speculative-decoding acceptance."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rollyard.engines.base import EngineStats

# The samples ``parse_vllm_metrics`` reads. vLLM's page is ~600 lines (50 KB: histogram
# buckets, ``_created`` stamps, HELP/TYPE); parsing it all took 7.7 ms (0.5 ms for these lines),
# paid at every poll of every engine: most of an idle gateway's CPU (7.3 -> 2.3 ms per second
# measured). Only these lines are handed to the parser.
_WANTED = frozenset(
    {
        "vllm:cache_config_info",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:num_preemptions",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_hits",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_queries",
        "vllm:request_prefill_kv_computed_tokens_sum",
        "vllm:request_prefill_time_seconds_sum",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:prompt_tokens_by_source_total",
    }
)


def _wanted_lines(text: str) -> str:
    """The sample lines of the metrics in ``_WANTED`` (no HELP/TYPE: every sample is read by name)."""
    keep = []
    for line in text.splitlines():
        if line.startswith("vllm:"):
            end = len(line)
            for sep in ("{", " "):
                i = line.find(sep)
                if 0 < i < end:
                    end = i
            if line[:end] in _WANTED:
                keep.append(line)
    return "\n".join(keep) + "\n"


def parse_vllm_metrics(text: str) -> EngineStats:
    """Sum each metric over its label sets (one engine may report several model labels)."""
    values: dict[str, float] = {}
    per_pos: dict[int, int] = {}
    sources: dict[str, int] = {}
    kv_capacity = 0
    for family in text_string_to_metric_families(_wanted_lines(text)):
        for s in family.samples:
            name = s.name
            if name == "vllm:cache_config_info":
                size = s.labels.get("kv_cache_size_tokens")
                if size and size.isdigit():
                    kv_capacity = int(size)
                elif s.labels.get("num_gpu_blocks") and s.labels.get("block_size"):
                    kv_capacity = int(s.labels["num_gpu_blocks"]) * int(s.labels["block_size"])
                continue
            if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                pos = int(s.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0) + int(s.value)
                continue
            if name == "vllm:prompt_tokens_by_source_total":
                src = s.labels.get("source", "")
                sources[src] = sources.get(src, 0) + int(s.value)
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
        spec_drafts=int(values.get("vllm:spec_decode_num_drafts_total", 0)),
        spec_draft_tokens=int(values.get("vllm:spec_decode_num_draft_tokens_total", 0)),
        spec_accepted_tokens=int(values.get("vllm:spec_decode_num_accepted_tokens_total", 0)),
        spec_accepted_per_pos=[per_pos.get(i, 0) for i in range(max(per_pos, default=-1) + 1)],
        prompt_tokens_by_source=sources,
    )


def acceptance(before: list[EngineStats] | None, after: list[EngineStats]) -> dict[str, Any]:
    """Speculative decoding between two reads of the same engines (``before`` None: since start).

    Mean acceptance length = 1 + accepted / drafts (tokens a request advances per verified draft,
    counting the one the target model always adds); per position: the fraction of drafts whose
    i-th token was accepted. An engine whose counters went down was restarted: its ``after``
    counts alone are used. Empty when nothing was drafted."""
    drafts = tokens = accepted = 0
    per_pos: list[int] = []
    for i, a in enumerate(after):
        b = before[i] if before is not None and i < len(before) else None
        if b is None or a.spec_drafts < b.spec_drafts:
            b = EngineStats()
        drafts += a.spec_drafts - b.spec_drafts
        tokens += a.spec_draft_tokens - b.spec_draft_tokens
        accepted += a.spec_accepted_tokens - b.spec_accepted_tokens
        for pos, n in enumerate(a.spec_accepted_per_pos):
            old = b.spec_accepted_per_pos[pos] if pos < len(b.spec_accepted_per_pos) else 0
            per_pos += [0] * (pos + 1 - len(per_pos))
            per_pos[pos] += n - old
    if drafts <= 0:
        return {}
    return {
        "spec_drafts": drafts,
        "spec_draft_tokens": tokens,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_len": 1.0 + accepted / drafts,
        "spec_accept_rate": accepted / tokens if tokens else 0.0,
        "spec_accepted_per_pos": [round(n / drafts, 4) for n in per_pos],
    }


def prompt_token_sources(text: str) -> dict[str, int]:
    """Prompt tokens by where their KV came from, from vLLM's
    ``vllm:prompt_tokens_by_source_total{source=...}`` (``local_compute``: prefilled here,
    ``local_cache_hit``: this engine's prefix cache, ``external_kv_transfer``: a KV connector,
    e.g. ``engine.kv_pool``), summed over model labels."""
    return parse_vllm_metrics(text).prompt_tokens_by_source


# vLLM's prompt-token sources -> the step rows' names (``prompt_tokens_{name}``)
_SOURCE_NAMES = {"local_compute": "computed", "local_cache_hit": "cached", "external_kv_transfer": "loaded"}


def prompt_sources(
    before: list[EngineStats] | None, after: list[EngineStats], names: list[str]
) -> dict[str, Any]:
    """Prompt tokens each engine computed, found in its own prefix cache and loaded through a KV
    connector (``engine.kv_pool``) between two reads of the same engines (``before`` None: since
    start): the totals as ``prompt_tokens_computed`` / ``_cached`` / ``_loaded``, and per engine
    under ``prompt_tokens_by_engine`` (with prefill/decode roles, which engine did which). An
    engine whose counters went down was restarted: its ``after`` counts alone are used. Empty
    when no engine reports the counter (vLLM before 0.11, other backends)."""
    totals = dict.fromkeys(_SOURCE_NAMES.values(), 0)
    by_engine: dict[str, dict[str, int]] = {}
    for i, (name, a) in enumerate(zip(names, after, strict=True)):
        if not a.prompt_tokens_by_source:
            continue
        b = before[i].prompt_tokens_by_source if before is not None and i < len(before) else {}
        if any(a.prompt_tokens_by_source.get(k, 0) < v for k, v in b.items()):
            b = {}
        mine = {
            _SOURCE_NAMES.get(src, src): n - b.get(src, 0) for src, n in a.prompt_tokens_by_source.items()
        }
        by_engine[name] = mine
        for k, n in mine.items():
            totals[k] = totals.get(k, 0) + n
    if not by_engine:
        return {}
    return {**{f"prompt_tokens_{k}": n for k, n in totals.items()}, "prompt_tokens_by_engine": by_engine}
