"""What goes into an agent's prompt from the playbook: the most relevant live rules for its
role and quantum, and the target repository's AGENTS.md (read only; the writes are in
reflection.services.injection)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from bursts.models import AgentRun
from psychonauts.workspaces.central import central_file
from psychonauts.workspaces.repository import repo_local, repo_url
from reflection.models import PlaybookRule, RuleMaturity

# How much a rule's maturity weighs in its score: a candidate is injected with a low weight.
MATURITY_WEIGHT: dict[str, float] = {
    RuleMaturity.CANDIDATE: 0.5,
    RuleMaturity.ESTABLISHED: 1.0,
    RuleMaturity.PROVEN: 1.5,
}
# The full-text rank (ts_rank over the OR of the quantum's words: about 0.015 a matching word)
# scaled to sit beside the bonuses: three matching words weigh about as much as a shared label.
TEXT_WEIGHT = 10.0
# Relevance added when the rule names the agent's role (an empty roles list fits any role),
# shares a label with the quantum, or names a path the quantum's text mentions.
ROLE_BONUS = 0.2
LABEL_BONUS = 0.5
PATH_BONUS = 0.3
# The quantum's text matched against the rules: its title and the start of its body.
QUERY_TEXT_MAX = 2000
AGENTS_MD_MAX_BYTES = 16_000
# The matching rules ranked per agent start, the most confident first (see RULES_SQL).
CANDIDATES = 200


@dataclass(frozen=True)
class ScoredRule:
    rule_id: int
    text: str
    kind: str
    maturity: str
    confidence: float
    relevance: float
    score: float


_R = PlaybookRule._meta.db_table
# One indexed query. The candidates are the live rules for the agent's role whose text matches
# the quantum's words (the GIN index playbookrule_search; the words OR-ed, any one matches) or
# whose labels overlap the quantum's (the GIN index playbookrule_labels): of those, the
# CANDIDATES most confident (when most rules match, Postgres walks playbookrule_confidence and
# stops there) are ranked, so the time stays flat however large the playbook grows.
RULES_SQL = f"""
WITH q AS (
    SELECT replace(plainto_tsquery('english', %(text)s)::text, '&', '|')::tsquery AS query
), candidates AS (
    SELECT r.id, r.text, r.kind, r.maturity, r.confidence, r.roles, r.labels, r.paths, r.search
    FROM {_R} r
    WHERE (r.search @@ (SELECT query FROM q) OR r.labels && %(labels)s::varchar[])
      AND r.maturity <> 'deprecated'
      AND (r.roles = '{{}}' OR r.roles @> ARRAY[%(role)s]::varchar[])
    ORDER BY r.confidence DESC, r.id
    LIMIT %(candidates)s
)
SELECT id, text, kind, maturity, confidence, relevance,
       relevance * confidence * (CASE maturity WHEN 'proven' THEN %(w_proven)s
                                               WHEN 'established' THEN %(w_established)s
                                               ELSE %(w_candidate)s END) AS score
FROM (
    SELECT c.id, c.text, c.kind, c.maturity, c.confidence,
           %(text_weight)s * ts_rank(c.search, (SELECT query FROM q))
           + CASE WHEN c.roles <> '{{}}' THEN %(role_bonus)s ELSE 0 END
           + CASE WHEN c.labels && %(labels)s::varchar[] THEN %(label_bonus)s ELSE 0 END
           + CASE WHEN c.paths <> '{{}}' AND EXISTS (
                 SELECT 1 FROM unnest(c.paths) p WHERE strpos(%(text)s, p) > 0
             ) THEN %(path_bonus)s ELSE 0 END AS relevance
    FROM candidates c
) ranked
ORDER BY score DESC, id
LIMIT %(limit)s
"""


def quantum_text(run: AgentRun) -> str:
    q = run.quantum
    return f"{q.title}\n{q.body}"[:QUERY_TEXT_MAX]


def rules_for(run: AgentRun, *, limit: int | None = None) -> list[ScoredRule]:
    """The most relevant non-deprecated rules for the agent run, best first: score =
    relevance (full-text rank against the quantum's title and body, plus the role, label and
    path bonuses) x confidence x maturity weight; top REFLECTION_INJECT_TOP_K."""
    top = settings.REFLECTION_INJECT_TOP_K if limit is None else limit
    if top <= 0:
        return []
    params: dict[str, Any] = {
        "text": quantum_text(run),
        "labels": list(run.quantum.labels),
        "role": run.role,
        "text_weight": TEXT_WEIGHT,
        "role_bonus": ROLE_BONUS,
        "label_bonus": LABEL_BONUS,
        "path_bonus": PATH_BONUS,
        "w_candidate": MATURITY_WEIGHT[RuleMaturity.CANDIDATE],
        "w_established": MATURITY_WEIGHT[RuleMaturity.ESTABLISHED],
        "w_proven": MATURITY_WEIGHT[RuleMaturity.PROVEN],
        "candidates": CANDIDATES,
        "limit": top,
    }
    with connection.cursor() as cursor:
        cursor.execute(RULES_SQL, params)
        rows = cursor.fetchall()
    return [
        ScoredRule(
            rule_id=row[0],
            text=row[1],
            kind=row[2],
            maturity=row[3],
            confidence=float(row[4]),
            relevance=float(row[5]),
            score=float(row[6]),
        )
        for row in rows
    ]


def agents_md() -> str:
    """The target repository's AGENTS.md (human conventions, never scored): a regular file,
    text only, at most AGENTS_MD_MAX_BYTES (cut there); "" when absent or not text."""
    if repo_url():  # a central repository: the file on its base branch, as last fetched
        data = central_file("AGENTS.md", limit=AGENTS_MD_MAX_BYTES + 1)
    else:
        path = repo_local() / "AGENTS.md"
        try:
            if path.is_symlink() or not path.is_file():
                return ""
            with path.open("rb") as f:
                data = f.read(AGENTS_MD_MAX_BYTES + 1)
        except OSError:
            return ""
    if b"\x00" in data:
        return ""
    cut = len(data) > AGENTS_MD_MAX_BYTES
    text = data[:AGENTS_MD_MAX_BYTES].decode("utf-8", errors="ignore").strip()
    if cut:
        text += f"\n\n(AGENTS.md cut at {AGENTS_MD_MAX_BYTES} bytes)"
    return text
