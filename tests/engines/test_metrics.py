"""Reading vLLM's ``/metrics``: only the samples rollyard uses are parsed, with the same result."""

from __future__ import annotations

import pytest

from rollyard.engines import metrics
from rollyard.engines.base import EngineStats
from rollyard.engines.metrics import parse_vllm_metrics

# The shapes vLLM 0.32's page has around the samples read: HELP/TYPE lines, ``_created`` stamps,
# histogram buckets, two model labels to sum, and names that only start like a wanted one.
PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="0",model_name="b"} 2.0
vllm:num_requests_running_extra{engine="0",model_name="a"} 99.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="a"} 7.0
vllm:num_preemptions_created{engine="0",model_name="a"} 1.7e+09
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="a"} 100.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="a"} 40.0
# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_bucket{engine="0",le="1.0",model_name="a"} 0.0
vllm:request_prefill_kv_computed_tokens_bucket{engine="0",le="+Inf",model_name="a"} 5.0
vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="a"} 5.0
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="a"} 640.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{engine="0",model_name="a"} 1.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="64",engine="0",num_gpu_blocks="256"} 1.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a",position="1"} 5.0
python_gc_objects_collected_total{generation="0"} 123.0
process_cpu_seconds_total 4.2
"""


def test_the_page_is_read_into_engine_stats() -> None:
    s = parse_vllm_metrics(PAGE)
    assert (s.running, s.waiting, s.kv_usage, s.preemptions) == (5, 4, 0.25, 7)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (100, 40)
    assert (s.prefill_tokens, s.prefill_s) == (640, 1.5)
    assert s.kv_capacity_tokens == 256 * 64
    assert s.spec_accepted_per_pos == [8, 5]


@pytest.mark.parametrize("page", [PAGE, PAGE.replace("\n", "\r\n"), ""])
def test_reading_only_the_wanted_lines_gives_what_parsing_the_whole_page_gives(
    page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = parse_vllm_metrics(page)
    monkeypatch.setattr(metrics, "_wanted_lines", lambda text: text)
    assert parse_vllm_metrics(page) == fast


def test_prompt_tokens_by_source_are_summed_per_source() -> None:
    from rollyard.engines.metrics import prompt_token_sources

    text = "\n".join(
        [
            "# TYPE vllm:prompt_tokens_by_source counter",
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="a",source="local_compute"} 64.0',
            'vllm:prompt_tokens_by_source_total{engine="0",model_name="b",source="local_compute"} 6.0',
            'vllm:prompt_tokens_by_source_total{model_name="a",source="external_kv_transfer"} 640.0',
            'vllm:prompt_tokens_by_source_created{engine="0",model_name="a",source="local_compute"} 1.7e9',
            'vllm:prefix_cache_hits_total{engine="0",model_name="a"} 5.0',
        ]
    )
    assert prompt_token_sources(text) == {"local_compute": 70, "external_kv_transfer": 640}


def _sources(**n: int) -> EngineStats:
    names = {"computed": "local_compute", "cached": "local_cache_hit", "loaded": "external_kv_transfer"}
    return EngineStats(prompt_tokens_by_source={names[k]: v for k, v in n.items()})


def test_the_step_rows_prompt_sources_are_per_engine_deltas_and_a_restart_counts_from_zero() -> None:
    from rollyard.engines.metrics import prompt_sources

    before = [_sources(computed=100, loaded=0), _sources(computed=50, cached=10, loaded=640)]
    after = [_sources(computed=400, loaded=0), _sources(computed=20, loaded=128)]  # engine1 restarted
    row = prompt_sources(before, after, ["engine0", "engine1"])
    assert row["prompt_tokens_by_engine"] == {
        "engine0": {"computed": 300, "loaded": 0},
        "engine1": {"computed": 20, "loaded": 128},
    }
    assert (row["prompt_tokens_computed"], row["prompt_tokens_cached"], row["prompt_tokens_loaded"]) == (
        320,
        0,
        128,
    )
    assert prompt_sources(None, after, ["engine0", "engine1"])["prompt_tokens_computed"] == 420
    assert prompt_sources(None, [EngineStats(), EngineStats()], ["a", "b"]) == {}  # no counter: no keys


def test_the_page_s_prompt_sources_reach_engine_stats() -> None:
    page = 'vllm:prompt_tokens_by_source_total{model_name="a",source="external_kv_transfer"} 64.0\n'
    assert parse_vllm_metrics(page).prompt_tokens_by_source == {"external_kv_transfer": 64}
