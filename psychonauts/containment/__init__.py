"""Containment: the sandbox every process of an agent runs in, the command guard, traumas,
the verify commands, the sandbox identities and the file tools' descriptor walk."""
