"""Benchmarks, one module each, run by ``rollyard bench NAME``.

A module exposes ``main(quick: bool) -> dict`` and uses ``report()`` to write
``bench/results/NAME.json`` and print the ``NAME: key=value ...`` line.
"""
