"""The gateway bench's paired rounds: every path once a round, the order rotating (two paths
alternate), ratios per round then their median."""

from __future__ import annotations

from rollyard.bench._gateway_rounds import median_ratio, rotating_rounds


async def test_paths_are_measured_in_rotating_order_and_ratios_are_medians_of_rounds() -> None:
    order: list[str] = []
    figures = {"a": iter([2.0, 4.0, 9.0]), "b": iter([1.0, 1.0, 1.0]), "c": iter([1.0, 2.0, 3.0])}

    async def measure(name: str) -> float:
        order.append(name)
        return next(figures[name])

    per = await rotating_rounds(["a", "b", "c"], 3, measure)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert per == {"a": [2.0, 4.0, 9.0], "b": [1.0, 1.0, 1.0], "c": [1.0, 2.0, 3.0]}
    assert median_ratio(per, "a", "b") == 4.0 and median_ratio(per, "a", "c") == 2.0

    two: list[str] = []

    async def record(name: str) -> float:
        two.append(name)
        return 1.0

    await rotating_rounds(["g", "r"], 3, record)
    assert two == ["g", "r", "r", "g", "g", "r"]
