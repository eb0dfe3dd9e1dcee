"""Goals: created, approved, decomposed by a planner agent into quanta, verified, done.

By subject: `lifecycle` (the only writer of Goal and GoalTransition: creation, approval,
abandonment, every status change as a compare-and-set with its history row and event),
`planning` (the epic and the planner agent), `progress` (what moves goals on, run by the
planner's chain and the hub's tick) and `verification` (the verify commands on the integration
branch).

The way through:
- `goal_create` (proposed) and `goal_approve` (the operator; never automatic) -> approved;
- `goals_decompose_due` files the goal's epic (kind epic, deferred: no wave runs it) and starts a
  planner agent on it -> decomposing; the planner hands its plan over with `submit_plan` (or as
  its final answer);
- `goals_progress` (the planner's task chain, and the hub's tick as the safety net) reads the
  plan of a planner run that ended: a valid one files the quanta as the epic's children with
  their dependencies -> active; an invalid one goes back to a new planner attempt with the
  problems, up to settings.AUTOPILOT_PLAN_TRIES, then the goal fails with them;
- once every child is closed, its branch reviewed and its change merged (or it made none) ->
  verifying, and `goal_verify` runs the goal's verify commands on the integration branch's tip
  -> done, or failed with the failing commands. A child reopened meanwhile sends the goal back
  to active.

A goal that fails keeps its quanta (the operator reads them, reopens or closes them, approves
the goal again: it is planned anew, the new plan's quanta beside the old ones). Abandoning a goal
closes its quanta that are not running, and its epic.
"""
