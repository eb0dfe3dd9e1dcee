"""The autopilot's writers: goals, the hub, budgets, scanners, contemplation, healing."""
