"""Workspaces and git: the current repository (repository.py), the worktree of each quantum
(worktrees.py), a central repository shared by hosts (central.py), and the hardened git runner
every one of them builds on (git.py)."""
