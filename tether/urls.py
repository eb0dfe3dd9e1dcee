from __future__ import annotations

from django.urls import path

from tether.views import changes, drifts, grounding, reachings

urlpatterns = [
    path("tether/", reachings.tether_page, name="tether"),
    path(
        "tether/reachings/<int:reaching_id>/answer/",
        reachings.reaching_answer_view,
        name="reaching_answer",
    ),
    path("tether/drifts/<int:drift_id>/ground/", drifts.drift_ground_view, name="drift_ground"),
    path("tether/drifts/<int:drift_id>/reject/", drifts.drift_reject_view, name="drift_reject"),
    path("tether/drifts/<int:drift_id>/note/", drifts.drift_note_view, name="drift_note"),
    path("grounding/", grounding.grounding_page, name="grounding"),
    path("grounding/changes/approve/", changes.changes_approve_view, name="changes_approve"),
    path("grounding/changes/<int:change_id>/", changes.change_page, name="change"),
    path(
        "grounding/changes/<int:change_id>/approve/",
        changes.change_approve_view,
        name="change_approve",
    ),
    path(
        "grounding/changes/<int:change_id>/reject/",
        changes.change_reject_view,
        name="change_reject",
    ),
    path(
        "grounding/mutations/<int:mutation_id>/approve/",
        grounding.mutation_approve_view,
        name="mutation_approve",
    ),
    path(
        "grounding/mutations/<int:mutation_id>/reject/",
        grounding.mutation_reject_view,
        name="mutation_reject",
    ),
]
