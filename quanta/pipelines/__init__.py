"""Pipelines: YAML definitions, validation, loading, matching and run snapshots."""
