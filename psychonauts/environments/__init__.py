"""Repositories' environments: declaration, builds, the egress proxy of a build."""
