"""The pages that compose several apps: the dashboard, a quantum, the pipelines."""
