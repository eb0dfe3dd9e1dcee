from __future__ import annotations

from django.urls import path

from reflection import views

urlpatterns = [
    path("playbook/", views.playbook_page, name="playbook"),
    path("playbook/deltas/<int:delta_id>/ground/", views.delta_ground_view, name="delta_ground"),
    path("playbook/deltas/<int:delta_id>/reject/", views.delta_reject_view, name="delta_reject"),
    path(
        "playbook/rules/<int:rule_id>/deprecate/",
        views.rule_deprecate_view,
        name="rule_deprecate",
    ),
    path("skills/", views.skills_page, name="skills"),
]
