"""Stand-ins for outside services, for tests and benchmarks."""
