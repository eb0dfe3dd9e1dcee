from __future__ import annotations

from django.urls import path

from psychonauts import views

urlpatterns = [
    path("<int:agent_run_id>/", views.focus, name="focus"),
    path("roles/", views.roles_page, name="roles"),
    path("run/<int:quantum_id>/", views.agent_run_start, name="agent_run_start"),
]
