"""One execution of one agent run: the turn loop, its checkpoints, its tool calls, its end."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from bursts.executor import Outcome
from bursts.models import AgentPhase, AgentRun, AgentStatus, QuantumRun
from core.events import EventBatch, publish_many
from core.redaction import MARK, TextStream, redact, redact_data
from psychonauts.containment.sandbox import SandboxEnvironment
from psychonauts.containment.verify import Check, VerifyReport, verify_commands_run
from psychonauts.environments.services import agent_sandbox_environment, environment_for_agent
from psychonauts.errors import CallPastDeadline, PsychonautError, WorkspaceError
from psychonauts.events import AgentEventType
from psychonauts.models import AgentTurn, Role, ToolCall
from psychonauts.routing import registry
from psychonauts.routing.cache_ttl import long_cache_pays
from psychonauts.routing.providers.base import (
    Message,
    Provider,
    ProviderRequest,
    ProviderResponse,
    RunInfo,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from psychonauts.runtime.budget import (
    CallSpend,
    Spend,
    WaveBudget,
    budget_check,
    cost_usd,
    spend_recorded,
)
from psychonauts.runtime.checkpoint import (
    TurnCompletion,
    TurnRecord,
    run_finish,
    tool_call_done,
    tool_call_open,
    turn_complete,
    turn_feedback,
    turn_open,
    turn_record,
)
from psychonauts.runtime.context import messages_fit, output_tokens
from psychonauts.runtime.loops import loop_find, loop_trauma_record
from psychonauts.runtime.prompt import agent_prompt
from psychonauts.runtime.runs import agent_run_stop_orphan, run_outcome
from psychonauts.runtime.spawn import Execute, agent_spawn
from psychonauts.runtime.tools import (
    VERDICT_TOOL,
    ToolContext,
    ToolResult,
    calls_change_workspace,
    tool_execute,
    tools_for,
)
from psychonauts.runtime.verification import (
    failure_reason,
    feedback_message,
    stage_checks,
    verdict_find,
    verification_record,
    verification_round,
)
from psychonauts.workspaces.central import (
    CentralConflict,
    Fence,
    StaleExecution,
    agent_landed,
    wip_restore,
    wip_save,
)
from psychonauts.workspaces.git import git
from psychonauts.workspaces.repository import branch_for, repo_local, repo_url
from psychonauts.workspaces.worktrees import (
    commit_message,
    workspace_commit,
    workspace_discard,
    workspace_prepare,
    workspace_ready,
    workspace_uncommitted,
)
from quanta.models import AuthorKind
from quanta.services import comment_add

logger = logging.getLogger(__name__)

# A caller watching a run (the CLI): called with each event's type and payload, except `text`,
# whose pieces it sees as ("delta", {"text": ...}) while the model writes.
Observer = Callable[[str, dict[str, Any]], None]


# What the model is told instead of running calls of a turn its output limit cut short: the last
# call's arguments may be incomplete, and running a call on half its input does harm (a file
# written half, `{}` for a command).
CUT_CALL = (
    "not run: your answer was cut off at the output limit ({max_tokens} tokens) before its tool "
    "calls were complete, so none of them was run. Make the calls again, smaller: split a long "
    "file into several edits or writes."
)
# What the model is told when the output limit cut its answer short of any tool call: it is not
# taken as the agent's final answer.
CUT_TEXT = (
    "Your answer was cut off at the output limit ({max_tokens} tokens), so it is not taken as "
    "your final answer. Be brief: make the next tool call now, or give a short final answer."
)
# The one reminder a reviewing role gets when it gives its final answer without a verdict.
VERDICT_REMINDER = (
    "You have not recorded a verdict. Call {tool} now, with verdict `pass` or `fail` and your "
    "reasons; it is a tool call, not text. Without it your stage fails."
)


class _Stop(PsychonautError):
    """The loop ends in error for a stated reason (max turns, timeout)."""


class Runner:
    """One execution of one agent run (a process may execute the same run again later).

    Writes are grouped per step of a turn, because a worker runs a hundred agents on one core:
    opening a turn is one statement, the provider's answer another (turn, usage, counters,
    pending tool calls), each finished tool call one, the run's end one (all in
    `psychonauts.runtime.checkpoint`). Events are buffered by `emit` and written by the next of these
    statements; streamed text during a long call goes out on its own, throttled.

    `resumed`: the run was started before (a crash, a redelivery, an answered question), so its
    turns are looked up; a fresh run has none.
    """

    def __init__(
        self,
        run: AgentRun,
        role: Role,
        route: tuple[Provider, str],
        observer: Observer | None,
        *,
        session_id: int,
        resumed: bool,
        execute: Execute,
    ) -> None:
        self.run = run
        self.role = role
        self.observer = observer
        self.resumed = resumed
        self.execute = execute  # for sub-agents
        self.topic = f"agent:{run.agent_id}"
        self.session_id = session_id
        self.provider, self.model = route
        self.wave: WaveBudget | None = None
        if run.quantum_run_id is not None:
            wave_id, limit = (
                QuantumRun.objects.filter(pk=run.quantum_run_id)
                .values_list("wave_id", "wave__budget_usd")
                .get()
            )
            self.wave = WaveBudget(wave_id, limit)
        # A central repository: this execution's hold on the agent there (taken with the
        # worktree; its pushes are refused once another execution takes the agent over).
        self.fence = (
            Fence(run.agent_id, note=f"attempt {run.attempt}", look_back=resumed)
            if repo_url()
            else None
        )
        # Turns before this index stay recorded but are not the model's conversation: the run
        # started over (`started_elsewhere`).
        self.offset = 0
        # The conversation's first message: built once per run, kept on the turn that opens
        # the conversation (a resumed run reads it back: the same rules, skill and conventions).
        self.prompt: str | None = None
        # A turn called a tool that can change the workspace: the agent's end commits.
        self.changed = False
        self._workspace: Future[Path] | Path = workspace_prepare(
            quantum_id=run.quantum_id, fence=self.fence
        )
        self.tools = tools_for(list(role.allowed_tools))
        self.pending: list[tuple[str, dict[str, Any]]] = []
        self._stream = TextStream()  # the model's deltas, let out redacted and by whole lines
        self._text: list[str] = []
        self._text_since = 0.0  # when the oldest text in _text came
        self.completion: TurnCompletion | None = None  # a finished turn not written yet
        # The repository's environment its commands run in; decided as the loop starts.
        self.environment: SandboxEnvironment | None = None
        self.max_tokens = settings.PSYCHONAUTS_MAX_TOKENS  # the answer's limit, per request

    @property
    def workspace(self) -> Path:
        """The run's working tree, once ready (WorkspaceError if it could not be made)."""
        if isinstance(self._workspace, Future):
            self._workspace = workspace_ready(
                self._workspace, quantum_id=self.run.quantum_id, fence=self.fence
            )
        return self._workspace

    # events -------------------------------------------------------------------------------
    def event(self, event_type: AgentEventType, **payload: Any) -> tuple[str, dict[str, Any]]:
        return event_type, {"agent_run_id": self.run.pk, "attempt": self.run.attempt, **payload}

    def emit(self, event_type: AgentEventType, **payload: Any) -> None:
        """Buffer an event (the observer sees it now); the next step's statement writes it."""
        self.pending.append(self.event(event_type, **payload))
        self.notify(*self.pending[-1])

    def notify(self, event_type: str, data: dict[str, Any]) -> None:
        if self.observer is not None and event_type != "text":
            self.observer(event_type, data)

    def take_events(self, *more: tuple[str, dict[str, Any]]) -> EventBatch:
        """The buffered events (and `more`), for the statement of the step that writes them."""
        batch = EventBatch(self.topic, [*self.pending, *more], self.session_id)
        self.pending = []
        return batch

    def flush_events(self) -> None:
        """The buffered events in a statement of their own (no step is due)."""
        if self.pending:
            self.take_events().record()

    def phase(self, phase: str) -> None:
        """The phase in memory, the registry and the event buffer; the row is written by the
        step that follows (`open_turn`, `checkpoint`, `finish_tools`)."""
        self.run.phase, self.run.heartbeat_at = phase, timezone.now()
        registry.registry_sync(self.run)
        self.emit("phase", phase=phase)

    def on_text(self, delta: str) -> None:
        # Only whole lines, redacted, go on (a whole private key block at once): a secret
        # split between two deltas would pass the redaction in halves.
        shown = self._stream.feed(delta)
        if not shown:
            return
        if self.observer is not None:
            self.observer("delta", {"text": shown})
        now = time.monotonic()
        if not self._text:
            self._text_since = now
        self._text.append(shown)
        # Throttled: text waits up to the flush interval for more of it, and goes out with the
        # turn's checkpoint when the stream ends sooner; not an event per token.
        if now - self._text_since >= settings.PSYCHONAUTS_TEXT_FLUSH_S:
            self.flush_text()
            self.flush_events()  # live while the model is still writing

    def end_text(self) -> None:
        """The stream has ended: what it held back (a last line without its newline) goes too."""
        rest = self._stream.finish()
        if rest:
            if self.observer is not None:
                self.observer("delta", {"text": rest})
            self._text.append(rest)
        self.flush_text()

    def flush_text(self) -> None:
        if self._text:
            self.emit("text", text="".join(self._text))
            self._text.clear()

    # the loop -----------------------------------------------------------------------------
    def messages(self, turns: list[AgentTurn]) -> list[Message]:
        if self.prompt is None:
            self.prompt = agent_prompt(self.run)
        messages: list[Message] = [{"role": "user", "content": self.prompt}]
        for turn in turns:
            messages.append({"role": "assistant", "content": turn.assistant})
            if turn.tool_results:
                messages.append({"role": "user", "content": turn.tool_results})
        return messages

    def open_turn(self) -> Spend | None:
        """Phase `thinking` and the buffered events in; the spend out, or None when the run is
        no longer running (the burst manager cancelled it)."""
        self.phase(AgentPhase.THINKING)
        run, wave = self.run, self.wave
        assert run.heartbeat_at is not None  # phase() stamped it
        spent = turn_open(
            agent_run_id=run.pk,
            phase=run.phase,
            now=run.heartbeat_at,
            quantum_run_id=run.quantum_run_id,
            agent_id=run.agent_id,
            attempt=run.attempt,
            budgeted_wave_id=wave.wave_id
            if wave is not None and wave.limit_usd is not None
            else None,
            events=self.take_events(),
            completion=self.completion,
        )
        self.completion = None
        return None if spent is None else Spend(*spent)

    def loop(self) -> Outcome:
        if "shell" in {t.name for t in self.tools}:
            # Built, or the run waits for it without a worker (EnvironmentWait), or it failed
            # and the run ends with the build's error before its first turn.
            self.environment = agent_sandbox_environment(
                environment_for_agent(agent_run_id=self.run.pk, repo=repo_local())
            )
        turns = (
            list(AgentTurn.objects.filter(agent_run=self.run).order_by("index"))
            if self.resumed
            else []
        )
        if turns and self.started_elsewhere(turns[-1]):
            self.offset = len(turns)
        if len(turns) > self.offset and turns[self.offset].prompt:
            self.prompt = turns[self.offset].prompt
        self.changed = any(calls_change_workspace(t.assistant) for t in turns)
        if len(turns) > self.offset and not turns[-1].complete:
            self.finish_tools(turns[-1])
        if len(turns) > self.offset and turns[-1].complete and not turns[-1].tool_results:
            # The final answer was saved before a crash: end as it would have, or (a failed
            # verification) go on with the corrective message.
            outcome = self.done(turns[-1])
            if outcome is not None:
                return outcome
        if not turns:
            self.start_clean()
        started = self.run.started_at or timezone.now()
        system = (
            self.role.system_prompt
            + "\n\nYou work in a git workspace; use paths relative to its root."
        )
        tools = [t.spec() for t in self.tools]
        while True:
            index = len(turns)
            if index - self.offset >= self.role.max_turns:
                raise _Stop(f"max turns ({self.role.max_turns}) reached without a final answer")
            elapsed = (timezone.now() - started).total_seconds()
            if elapsed > self.role.timeout_s:
                raise _Stop(f"timeout: {elapsed:.0f}s > {self.role.timeout_s}s")
            # A sub-agent looks up its chain of parents before each turn: one that ended
            # (its run, stage or wave ended; it was cancelled) takes its whole tree with it.
            agent_run_stop_orphan(run=self.run)
            spend = self.open_turn()
            if spend is None:  # someone else ended it: the burst manager, or its parent's end
                return self.ended_elsewhere()
            messages = self.messages(turns[self.offset :])
            # An endpoint with a registered context size gets a conversation that fits it.
            context_tokens: int | None = getattr(self.provider, "context_tokens", None)
            self.max_tokens = output_tokens(settings.PSYCHONAUTS_MAX_TOKENS, context_tokens)
            fitted = messages_fit(
                messages,
                system=system,
                tools=tools,
                context_tokens=context_tokens,
                max_tokens=self.max_tokens,
            )
            if fitted.trimmed:
                self.emit(
                    "context_trimmed",
                    pieces=fitted.trimmed,
                    chars=fitted.chars,
                    context_tokens=context_tokens,
                )
            messages = fitted.messages
            budget_check(
                self.run,
                spend=spend,
                wave=self.wave,
                model=self.model,
                estimate_tokens_in=(len(system) + len(json.dumps(messages))) // 4,
            )
            request = ProviderRequest(
                deadline=time.monotonic() + self.role.timeout_s - elapsed,
                model=self.model,
                system=system,
                messages=messages,
                tools=tools,
                max_tokens=self.max_tokens,
                long_cache=self.provider.uses_llm
                and long_cache_pays(
                    role=self.run.role,
                    whole_chars=len(system) + len(json.dumps(messages)),
                    new_chars=len(json.dumps(messages[-2:])),
                ),
                run=RunInfo(
                    agent_run_id=self.run.pk,
                    agent_id=self.run.agent_id,
                    role=self.run.role,
                    attempt=self.run.attempt,
                    quantum_id=self.run.quantum_id,
                    labels=tuple(self.run.quantum.labels),
                    depth=self.run.depth,
                ),
            )
            if self.provider.uses_llm:
                _release_connection()
            try:
                response = self.provider.complete(request, self.on_text)
            except CallPastDeadline as exc:
                # Nothing of the cut answer is kept: it is neither a turn nor a final answer.
                elapsed = (timezone.now() - started).total_seconds()
                raise _Stop(f"timeout: {elapsed:.0f}s > {self.role.timeout_s}s ({exc})") from exc
            finally:
                self.end_text()
            # The tools get the model's own input (a file it writes holds what it wrote); the
            # turn, its tool calls and their events are stored and shown redacted.
            originals = {use["id"]: use["input"] for use in response.tool_uses}
            response = dataclasses.replace(response, content=redact_data(response.content))
            turn, calls = self.checkpoint(index, response)
            turns.append(turn)
            self.changed = self.changed or calls_change_workspace(turn.assistant)
            if not response.tool_uses and response.stop_reason == "max_tokens":
                # Not a final answer: the output limit cut it. The model is told and goes on.
                cut: list[TextBlock] = [
                    {"type": "text", "text": CUT_TEXT.format(max_tokens=self.max_tokens)}
                ]
                turn.tool_results = list(cut)
                turn_feedback(turn_id=turn.pk, content=cut)
                continue
            if not response.tool_uses:
                outcome = self.done(turn)
                if outcome is not None:
                    return outcome
                continue  # verification failed (or a verdict is owed): the agent goes on
            self.finish_tools(turn, calls, originals)
            if self.verdict_given(turn, calls):
                # A reviewing role whose turn only recorded its verdict has said its last word:
                # it ends here rather than be asked again (and call report_verdict again).
                assert self.completion is not None
                turn_complete(self.completion)
                self.completion = None
                outcome = self.done(turn)
                if outcome is not None:
                    return outcome
            self.stop_if_looping(turns[self.offset :])

    def stop_if_looping(self, turns: list[AgentTurn]) -> None:
        """End the run (in error, with the reason) when its turns show a loop, recording what
        it repeated as a trauma of its quantum (psychonauts.runtime.loops)."""
        loop = loop_find(turns)
        if loop is None:
            return
        loop_trauma_record(loop=loop, quantum_id=self.run.quantum_id, agent_id=self.run.agent_id)
        raise _Stop(loop.reason)

    def start_clean(self) -> None:
        """A fresh attempt of a stage's agent starts from its branch tip: what an earlier attempt
        left uncommitted (it was cancelled, or failed, mid-work) is discarded, and the
        `workspace_cleaned` event lists it. Not when the tree is shared with work in progress:
        a sub-agent works in its parent's tree, a fan-out sibling or an agent waiting on the
        Tether may be at work in the quantum's tree, and the shared mode has one tree for all."""
        run = self.run
        if (
            run.quantum_run_id is None  # a run from the command line: the operator's tree
            or run.parent_id is not None
            or settings.PSYCHONAUTS_WORKSPACE_MODE == "shared"
            or AgentRun.objects.filter(
                quantum_id=run.quantum_id,
                status__in=(AgentStatus.RUNNING, AgentStatus.WAITING),
            )
            .exclude(pk=run.pk)
            .exists()
        ):
            return
        workspace = self.workspace
        discarded = workspace_discard(workspace, quantum_id=run.quantum_id)
        if discarded:
            tip = git("rev-parse", "HEAD", cwd=workspace)
            self.emit(
                "workspace_cleaned",
                commit=tip,
                files=discarded[:100],
                count=len(discarded),
                reason="left uncommitted by an earlier attempt: discarded, this attempt "
                f"starts from {branch_for(run.quantum_id)} at {tip[:10]}",
            )

    def verdict_given(self, turn: AgentTurn, calls: dict[str, ToolCall]) -> bool:
        """The turn's calls were all report_verdict, and one of them recorded a verdict."""
        if VERDICT_TOOL not in self.role.allowed_tools or turn.stop_reason == "max_tokens":
            return False
        uses = [b for b in turn.assistant if b.get("type") == "tool_use"]
        return (
            bool(uses)
            and all(u["name"] == VERDICT_TOOL for u in uses)
            and any(u["id"] in calls and not calls[u["id"]].is_error for u in uses)
        )

    def ended_elsewhere(self) -> Outcome:
        """The run was ended by someone else (the burst manager cancelled it, or its parent's
        end stopped it): its outcome is theirs, and it does nothing more."""
        if self.completion is not None:  # the last turn's results stay the run's record
            turn_complete(self.completion)
            self.completion = None
        self.run.refresh_from_db(fields=["status", "result", "error"])
        registry.registry_remove(self.run.pk)
        if self.run.status == AgentStatus.CANCELLED:
            self.emit("cancelled", reason=self.run.error or "cancelled by the burst manager")
        self.flush_events()
        return run_outcome(self.run)

    def still_running(self) -> bool:
        """Whether the run is still this execution's to end: not cancelled meanwhile, and (a
        sub-agent) no agent above it has ended."""
        agent_run_stop_orphan(run=self.run)
        return AgentRun.objects.filter(pk=self.run.pk, status=AgentStatus.RUNNING).exists()

    def started_elsewhere(self, last: AgentTurn) -> bool:
        """A central repository, and this resumed run's earlier turns ran on another host. When
        that execution let the agent wait (the Tether, a budget), it set the agent's uncommitted
        work aside centrally: it is applied here and the agent goes on. When it was cut off
        mid-work, the files its tool calls wrote are in that host's worktree, out of reach: the
        agent starts over here (its recorded turns stay, as history), unless its final answer
        was recorded and its commit landed. Starting over too when the set-aside work does not
        apply to the branch as it is now."""
        if self.fence is None:
            return False
        self.workspace  # noqa: B018 -- the fence, taken with the worktree, names the previous host
        previous = self.fence.previous_host
        if not previous or previous == self.fence.host:
            return False
        why = "whose uncommitted work is out of reach"
        if self.fence.previous_wip:
            try:
                wip_restore(
                    workspace=self.workspace, quantum_id=self.run.quantum_id, fence=self.fence
                )
            except CentralConflict as exc:
                why = str(exc)
            else:
                self.emit("restored", host=previous, wip=self.fence.previous_wip)
                return False
        else:
            run = self.run
            subject = commit_message(run.quantum_id, run.agent_id, run.role)
            if last.complete and not last.tool_results and agent_landed(run.quantum_id, subject):
                return False
        self.emit(
            "restarted",
            reason=f"resumed on {self.fence.host}; its earlier turns ran on {previous}, "
            f"{why}: the agent starts over",
        )
        return True

    def set_aside(self) -> Outcome | None:
        """The agent is about to wait (holding no worker): with a central repository its
        uncommitted work is set aside there, for whichever host resumes it. A stale outcome when
        another execution holds the agent; a failure to reach the central repository is logged
        and the agent waits anyway (resumed on another host, it then starts over)."""
        if self.fence is None:
            return None
        try:
            wip = wip_save(workspace=self.workspace, fence=self.fence)
        except StaleExecution as exc:
            return self.stale(str(exc))
        except WorkspaceError as exc:
            logger.warning(
                "agent %s: its work could not be set aside: %s", self.run.agent_id, exc,
                extra={"agent_run_id": self.run.pk},
            )  # fmt: skip
            return None
        self.emit("set_aside", wip=wip)
        return None

    def checkpoint(
        self, index: int, response: ProviderResponse
    ) -> tuple[AgentTurn, dict[str, ToolCall]]:
        """The provider's answer, durable in one statement: the turn, its usage and cost, the
        run's counters and phase, its tool calls (pending, announced) and the buffered events."""
        model = response.model or self.model
        cost = cost_usd(
            model,
            response.tokens_in,
            response.tokens_out,
            cache_read=response.cache_read,
            cache_write=response.cache_write,
            cache_write_long=response.cache_write_long,
        )
        now = timezone.now()
        self.emit(
            "usage",
            provider=self.provider.name,
            model=model,
            tokens_in=response.tokens_in,
            tokens_out=response.tokens_out,
            cache_read=response.cache_read,
            cache_write=response.cache_write + response.cache_write_long,
            cost_usd=None if cost is None else str(cost),
        )
        tool_uses = response.tool_uses
        if tool_uses:
            self.phase(AgentPhase.TOOL_USE)
        for use in tool_uses:
            self.emit("tool_call", id=use["id"], name=use["name"], input=use["input"])
        turn_id, call_ids = turn_record(
            TurnRecord(
                agent_run_id=self.run.pk,
                quantum_run_id=self.run.quantum_run_id,
                wave_id=self.wave.wave_id if self.wave is not None else None,
                index=index,
                assistant=list(response.content),
                tool_uses=tool_uses,
                stop_reason=response.stop_reason,
                tokens_in=response.tokens_in,
                tokens_out=response.tokens_out,
                provider=self.provider.name,
                model=model,
                cost_usd=cost,
                phase=self.run.phase,
                now=now,
                prompt=redact(self.prompt or "") if index == self.offset else "",
                cache_read=response.cache_read,
                cache_write=response.cache_write,
                cache_write_long=response.cache_write_long,
            ),
            self.take_events(),
        )
        spend_recorded(
            CallSpend(
                agent_run_id=self.run.pk,
                quantum_id=self.run.quantum_id,
                labels=tuple(self.run.quantum.labels),
                provider=self.provider.name,
                model=model,
                tokens_in=response.tokens_in,
                tokens_out=response.tokens_out,
                usd=cost or Decimal(0),
                priced=cost is not None,
                cache_read=response.cache_read,
                cache_write=response.cache_write + response.cache_write_long,
            )
        )
        turn = AgentTurn(
            pk=turn_id,
            agent_run_id=self.run.pk,
            index=index,
            assistant=list(response.content),
            stop_reason=response.stop_reason,
            complete=not tool_uses,
            tokens_in=response.tokens_in,
            tokens_out=response.tokens_out,
            created_at=now,
        )
        calls: dict[str, ToolCall] = {}
        for use in tool_uses:
            calls[use["id"]] = ToolCall(
                pk=call_ids[use["id"]],
                agent_run_id=self.run.pk,
                turn_index=index,
                tool_use_id=use["id"],
                name=use["name"],
                input=use["input"],
                created_at=now,
            )
        return turn, calls

    def finish_tools(
        self,
        turn: AgentTurn,
        fresh: dict[str, ToolCall] | None = None,
        originals: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Run the turn's tool calls that have not completed yet, then complete the turn.

        `fresh`: the calls `checkpoint` has just recorded and announced. Without it (resuming a
        turn a crash or a question interrupted) they are read back, and announced as they run.
        `originals`: the model's inputs by tool use id, before redaction (the turn holds them
        redacted); resumed calls have only the stored ones.
        """
        if fresh is None:
            calls = {
                c.tool_use_id: c
                for c in ToolCall.objects.filter(agent_run=self.run, turn_index=turn.index)
            }
        else:
            calls = fresh
        uses: list[ToolUseBlock] = [b for b in turn.assistant if b.get("type") == "tool_use"]
        pending = [u["id"] for u in uses if u["id"] not in calls or not calls[u["id"]].completed]
        if fresh is None and pending:
            # A run resumed after its question was answered has every call completed: it goes
            # straight on to its next turn, with no tool-use phase in between.
            self.phase(AgentPhase.TOOL_USE)
        results: list[ToolResultBlock] = []
        unrecorded: ToolCall | None = None
        for use in uses:
            call = calls.get(use["id"])
            if call is None or not call.completed:
                # The last one is recorded with the turn's completion: one statement less.
                last = use["id"] == pending[-1]
                call = self.run_tool(
                    turn.index,
                    use,
                    call,
                    announce=fresh is None,
                    record=not last,
                    original=(originals or {}).get(use["id"]),
                    cut=turn.stop_reason == "max_tokens",
                )
                unrecorded = call if last else None
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": use["id"],
                    "content": call.output,
                    "is_error": call.is_error,
                }
            )
        turn.tool_results = list(results)
        turn.complete = True
        # Written by the next turn's opening (or by the run's end): each completed call is
        # durable on its own, and a turn left incomplete by a crash meanwhile is completed on
        # resume from those rows.
        self.completion = TurnCompletion(turn.pk, turn.tool_results, unrecorded)

    def run_tool(
        self,
        turn_index: int,
        use: ToolUseBlock,
        call: ToolCall | None,
        *,
        announce: bool,
        record: bool = True,
        original: dict[str, Any] | None = None,
        cut: bool = False,
    ) -> ToolCall:
        """Execute one tool call; `record`: write its result now (else the caller writes it).
        `use` is the stored (redacted) call; the tool runs with `original`, the model's input,
        when there is one."""
        if call is None:
            call = tool_call_open(
                agent_run_id=self.run.pk,
                turn_index=turn_index,
                tool_use_id=use["id"],
                name=use["name"],
                input=use["input"],
            )
        if announce:
            self.emit("tool_call", id=use["id"], name=use["name"], input=use["input"])
            self.flush_events()  # the operator sees a long command start, not only its end
        if settings.DB_POOL_MAX:
            # A shell command may run for minutes, the workspace may still be being made:
            # handing the connection back is cheap.
            _release_connection()
        ctx = ToolContext(
            agent_run_id=self.run.pk,
            agent_id=self.run.agent_id,
            attempt=self.run.attempt,
            quantum_id=self.run.quantum_id,
            role=self.run.role,
            depth=self.run.depth,
            workspace=self.workspace,
            shared=settings.PSYCHONAUTS_WORKSPACE_MODE == "shared",
            turn_index=turn_index,
            tool_use_id=use["id"],
            environment=self.environment,
            spawn=lambda specs: agent_spawn(
                parent=self.run, turn_index=turn_index, specs=specs, execute=self.execute
            ),
        )
        started = time.monotonic()
        if cut:
            result = ToolResult(CUT_CALL.format(max_tokens=self.max_tokens), True)
        elif original is None and MARK in json.dumps(use["input"], ensure_ascii=False):
            # Resumed: the model's input held a secret, and only its redacted form was kept.
            # Running that would write the mark where the secret was (into a file, a command).
            result = ToolResult(
                "not run: this call's input held a secret, which is not kept across a restart; "
                "make the call again",
                True,
            )
        else:
            # SuspendRun propagates: the call stays pending until tool_call_complete records it.
            args = use["input"] if original is None else original
            result = tool_execute(ctx, use["name"], args, list(self.role.allowed_tools))
        call.output, call.is_error, call.completed = result.output, result.is_error, True
        call.duration_ms = int((time.monotonic() - started) * 1000)
        if record:
            tool_call_done(
                call_id=call.pk,
                output=call.output,
                is_error=call.is_error,
                duration_ms=call.duration_ms,
            )
        self.emit(
            "tool_result",
            id=use["id"],
            name=use["name"],
            output=result.output[:2000],
            is_error=result.is_error,
            duration_ms=call.duration_ms,
        )
        return call

    def done(self, turn: AgentTurn) -> Outcome | None:
        """The agent's final answer: commit its work, verify it (a `verify` stage), weigh its
        verdict (a role with `report_verdict`), end the run. None: the verification failed and
        its corrective message is now the turn's reply; the loop goes on."""
        text = "".join(b.get("text", "") for b in turn.assistant if b.get("type") == "text")
        if not self.still_running():
            # Its run, stage or wave ended (or its parent did) while it worked: what it left in
            # the worktree is not committed; the next attempt starts from the branch's tip.
            return self.ended_elsewhere()
        sha = ""
        try:
            workspace = self.workspace  # made (and fenced) even when there is nothing to commit
            if self.changed:  # git only for an agent whose tools could have changed the tree
                sha = workspace_commit(
                    workspace=workspace,
                    quantum_id=self.run.quantum_id,
                    agent_id=self.run.agent_id,
                    role=self.run.role,
                    fence=self.fence,
                )
        except StaleExecution as exc:
            return self.stale(str(exc))
        if sha:
            text += f"\n\n(committed {sha[:10]} on {branch_for(self.run.quantum_id)})"
            self.emit("committed", sha=sha, branch=branch_for(self.run.quantum_id))
        checks = stage_checks(self.run)
        commands = list(self.run.quantum.verify_commands or [])
        if checks.verify and commands:
            report, reason = self.verify(turn, commands, sha=sha, retries=checks.retries)
            if reason:
                return self.finish(AgentStatus.ERROR, result=text.strip(), error=reason)
            if not report.passed:
                return None  # the corrective message is the turn's reply now
            text += f"\n\nVerified: {len(report.checks)} check(s) passed."
        if VERDICT_TOOL in self.role.allowed_tools:
            return self.judge(text.strip(), blocks=checks.verdict_blocks, turn=turn)
        return self.finish(AgentStatus.DONE, result=text.strip())

    def verify(
        self, turn: AgentTurn, commands: list[str], *, sha: str, retries: int
    ) -> tuple[VerifyReport, str]:
        """Run the verify commands on the committed work (a round). A failed round within the
        retries becomes the turn's corrective reply; the reason is the run's error when it was
        the last one ("" otherwise)."""
        commit = sha or git("rev-parse", "HEAD", cwd=self.workspace)
        round = verification_round(agent_run_id=self.run.pk)
        self.phase(AgentPhase.TOOL_USE)
        self.emit("verification_started", round=round, commit=commit, commands=commands)
        self.flush_events()  # the operator sees a long verification start, not only its end
        # The verification is recorded against `commit`: it runs on exactly that, or not at
        # all. Files the commit does not hold (written after it, or by someone else) would make
        # it pass or fail on what nobody committed.
        uncommitted = workspace_uncommitted(self.workspace)
        _release_connection()  # the commands may run for minutes
        if uncommitted:
            report = _not_the_commit(commands, commit, uncommitted)
        else:
            report = verify_commands_run(
                commands, workspace=self.workspace, quantum_id=self.run.quantum_id
            )
        retry = not report.passed and round <= retries
        feedback = (
            feedback_message(report, commit=commit, round=round, retries=retries) if retry else ""
        )
        _, payload = verification_record(
            run=self.run,
            round=round,
            report=report,
            commit_sha=commit,
            feedback_turn_id=turn.pk if retry else None,
            feedback=feedback,
        )
        self.emit("verification", **payload)
        if retry:
            turn.tool_results = [{"type": "text", "text": feedback}]
        if report.passed or retry:
            return report, ""
        return report, failure_reason(report, commit=commit, round=round)

    def judge(self, text: str, *, blocks: bool, turn: AgentTurn) -> Outcome | None:
        """End a reviewing role's run by its verdict: none fails it (after one reminder turn:
        None, the reminder is the turn's reply), `fail` fails it when the stage's verdict
        blocks, else the reasons become a comment on the quantum."""
        verdict = verdict_find(agent_run_id=self.run.pk)
        if verdict is None and not self.reminded() and turn.pk is not None:
            reminder = VERDICT_REMINDER.format(tool=VERDICT_TOOL)
            turn.tool_results = [{"type": "text", "text": reminder}]
            turn_feedback(turn_id=turn.pk, content=[{"type": "text", "text": reminder}])
            self.emit("verdict_reminded", reminder=reminder)
            return None
        if verdict is None:
            return self.finish(
                AgentStatus.ERROR,
                result=text,
                error=f"no verdict: the {self.run.role} role must end by calling {VERDICT_TOOL}",
            )
        self.emit("verdict", verdict=verdict.verdict, reasons=verdict.reasons, blocks=blocks)
        result = f"VERDICT: {verdict.verdict.upper()}\n{verdict.reasons}\n\n{text}".strip()
        if verdict.passed:
            return self.finish(AgentStatus.DONE, result=result)
        if blocks:
            return self.finish(AgentStatus.ERROR, result=result, error=verdict.reasons)
        # Before the end, not after: a crash between the two repeats the comment rather than
        # losing it.
        comment_add(
            quantum_id=self.run.quantum_id,
            body=f"{self.run.role} {self.run.agent_id} (verdict: fail, not blocking):\n"
            + verdict.reasons,
            author=self.run.agent_id,
            author_kind=AuthorKind.PSYCHONAUT,
        )
        return self.finish(AgentStatus.DONE, result=result)

    def reminded(self) -> bool:
        """Whether the run was reminded of its verdict before (its one reminder is spent): the
        reminder is a turn's stored reply, so a resumed run knows it too."""
        reminder = VERDICT_REMINDER.format(tool=VERDICT_TOOL)
        return AgentTurn.objects.filter(
            agent_run_id=self.run.pk, tool_results__contains=[{"type": "text", "text": reminder}]
        ).exists()

    def stale(self, reason: str) -> Outcome:
        """This execution lost its agent to another one (taken over on another host while this
        one was presumed dead): its commit did not land, and the run's end is the other
        execution's to record (bursts records nothing of a `stale` outcome), its entry in the
        registry of running agents too."""
        self.emit("stale", reason=reason)
        self.flush_events()
        return Outcome("stale", error=reason)

    def finish(self, status: str, *, result: str = "", error: str = "") -> Outcome:
        """End the run with `status` (done or error), unless someone else ended it first."""
        result, error = redact(result), redact(error)  # stored, published, returned to the CLI
        run = self.run
        phase = AgentPhase.DONE if status == AgentStatus.DONE else AgentPhase.ERROR
        if self.completion is not None:  # the loop stopped before opening another turn
            turn_complete(self.completion)
            self.completion = None
        buffered = list(self.pending)
        outcome = self.event(
            "done" if status == AgentStatus.DONE else "error", result=result[:2000], error=error
        )
        finished = run_finish(
            agent_run_id=run.pk,
            status=status,
            phase=phase,
            result=result,
            error=error,
            now=timezone.now(),
            session_id=self.session_id,
            events=self.take_events(outcome),
        )
        registry.registry_remove(run.pk)
        if not finished:
            # Someone else decided first (the burst manager cancelled it): their word stands, and
            # only the events from before the end are the run's.
            publish_many(self.topic, buffered, session_id=self.session_id)
            run.refresh_from_db()
            return run_outcome(run)
        self.notify(*outcome)
        return Outcome(status, result, error)  # type: ignore[arg-type]


def _not_the_commit(commands: list[str], commit: str, uncommitted: list[str]) -> VerifyReport:
    """A verification that could not run on `commit` alone: each command fails, not run."""
    shown = ", ".join(uncommitted[:20]) + (" ..." if len(uncommitted) > 20 else "")
    reason = (
        f"not run: the workspace holds changes that commit {commit[:10]} does not ({shown}); "
        "a verification runs on exactly the commit it records"
    )
    return VerifyReport(tuple(Check(c, False, None, reason, "", 0.0) for c in commands))


def _release_connection() -> None:
    """Before a wait of seconds or minutes (an LLM call, a tool): do not sit on a Postgres
    connection meanwhile. Pooled, it goes back to the pool for other agents' short steps; a
    hundred agents on a threads worker would otherwise hold a hundred."""
    if not connection.in_atomic_block:
        connection.close()
