"""Small factories: a quantum with sensible defaults, and a dependency chain."""

from __future__ import annotations

from typing import Any

from quanta import services
from quanta.models import Quantum


def make_quantum(title: str = "A quantum", **fields: Any) -> Quantum:
    return services.quantum_create(title=title, **fields)


def make_chain(n: int, *, prefix: str = "step") -> list[Quantum]:
    """q[i+1] waits on q[i]."""
    chain = [make_quantum(f"{prefix} 0")]
    for i in range(1, n):
        chain.append(make_quantum(f"{prefix} {i}", depends_on=[chain[-1].pk]))
    return chain
