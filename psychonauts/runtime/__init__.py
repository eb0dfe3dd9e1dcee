"""The agent runtime: an agent run's turns (runner.py), the statement that records each turn
(checkpoint.py), its tools, prompt, context and budget, and the services that create, execute,
spawn and sweep runs."""
