"""Side-by-side benchmarks: featurelake against its baselines, in one process, as ratios.

``python -m benchmarks`` runs every registered benchmark; ``python -m benchmarks
backfill read`` runs some. Results land in ``benchmarks/results/<name>.json``.
A new benchmark is a module with ``NAME`` and ``run(cfg: Config) -> dict``,
added to ``REGISTRY`` in ``benchmarks/__main__.py``.
"""
