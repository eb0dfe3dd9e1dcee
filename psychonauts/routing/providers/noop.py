"""`noop`: finishes at once with a short result and no LLM (benchmarks, or a run or role that
names it; trivial quanta with mechanical steps run on `shell`)."""

from __future__ import annotations

from psychonauts.routing.providers.base import OnText, ProviderRequest, ProviderResponse


class NoopProvider:
    name = "noop"
    uses_llm = False

    def complete(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        text = f"noop: {request.run.role} finished {request.run.agent_id} without an LLM."
        on_text(text)
        return ProviderResponse(
            content=[{"type": "text", "text": text}], stop_reason="end_turn", model="noop"
        )
