"""Data tools: ``prepare`` (records + media -> an Energon dataset), ``inspect_dataset`` and
deterministic ``synthetic`` datasets.
"""
