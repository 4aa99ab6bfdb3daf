"""Embedded run configs: ``demo`` (the README's main job) and ``quick`` (tests, smoke runs)."""
