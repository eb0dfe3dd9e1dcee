from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from annihilation.views import dashboard, pipelines, quantum, sessions

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("quanta/<int:quantum_id>/", quantum.quantum_detail, name="quantum"),
    path("pipelines/", pipelines.pipelines, name="pipelines"),
    path("pipelines/load/", pipelines.pipelines_load_pasted, name="pipelines_load"),
    path("sessions/", sessions.sessions_page, name="sessions"),
    path("", include("quanta.urls")),
    path("waves/start/", dashboard.wave_start_view, name="wave_start"),
    path("waves/", include("bursts.urls")),
    path("agents/", include("psychonauts.urls")),
    path("", include("tether.urls")),
    path("", include("autopilot.urls")),
    path("", include("reflection.urls")),
    path("admin/", admin.site.urls),
    path("healthz", dashboard.healthz, name="healthz"),
    path("", include("operations.urls")),
]
