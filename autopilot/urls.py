from __future__ import annotations

from django.urls import path

from autopilot.views import goals, hub

urlpatterns = [
    path("goals/", goals.goals_page, name="goals"),
    path("goals/new/", goals.goal_create_view, name="goal_create"),
    path("goals/<int:goal_id>/", goals.goal_view, name="goal"),
    path("goals/<int:goal_id>/approve/", goals.goal_approve_view, name="goal_approve"),
    path("goals/<int:goal_id>/abandon/", goals.goal_abandon_view, name="goal_abandon"),
    path("autopilot/", hub.autopilot_page, name="autopilot"),
    path("autopilot/pause/", hub.autopilot_pause_view, name="autopilot_pause"),
    path("autopilot/resume/", hub.autopilot_resume_view, name="autopilot_resume"),
    path("autopilot/force/", hub.autopilot_force_view, name="autopilot_force"),
]
