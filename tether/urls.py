from __future__ import annotations

from django.urls import path

from tether import views

urlpatterns = [
    path("tether/", views.tether_page, name="tether"),
    path(
        "tether/reachings/<int:reaching_id>/answer/",
        views.reaching_answer_view,
        name="reaching_answer",
    ),
    path("tether/drifts/<int:drift_id>/ground/", views.drift_ground_view, name="drift_ground"),
    path("tether/drifts/<int:drift_id>/reject/", views.drift_reject_view, name="drift_reject"),
    path("tether/drifts/<int:drift_id>/note/", views.drift_note_view, name="drift_note"),
    path("grounding/", views.grounding_page, name="grounding"),
    path("grounding/changes/<int:change_id>/", views.change_page, name="change"),
    path(
        "grounding/changes/<int:change_id>/approve/",
        views.change_approve_view,
        name="change_approve",
    ),
    path(
        "grounding/changes/<int:change_id>/reject/", views.change_reject_view, name="change_reject"
    ),
    path(
        "grounding/mutations/<int:mutation_id>/approve/",
        views.mutation_approve_view,
        name="mutation_approve",
    ),
    path(
        "grounding/mutations/<int:mutation_id>/reject/",
        views.mutation_reject_view,
        name="mutation_reject",
    ),
]
