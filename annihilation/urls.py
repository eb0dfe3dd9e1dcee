from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from annihilation.views import dashboard, pipelines, quantum, repositories, sessions
from core.ratelimit import posts_limited

# The apps' admin modules, registered here rather than at start-up (settings: SimpleAdminConfig).
admin.autodiscover()

# Login attempts per client address (django-axes still locks out a username on failures).
login_limited = posts_limited("login", per_min_setting="LOGIN_ATTEMPTS_PER_MIN")

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("login/", login_limited(auth_views.LoginView.as_view()), name="login"),
    path("admin/login/", login_limited(admin.site.login)),
    path("api/", include("api.urls")),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("quanta/<int:quantum_id>/", quantum.quantum_detail, name="quantum"),
    path("pipelines/", pipelines.pipelines, name="pipelines"),
    path("pipelines/load/", pipelines.pipelines_load_pasted, name="pipelines_load"),
    path("sessions/", sessions.sessions_page, name="sessions"),
    path("repositories/", repositories.repositories_page, name="repositories"),
    path("repositories/add/", repositories.repository_add, name="repository_add"),
    path(
        "repositories/environments/<int:build_id>/log/",
        repositories.environment_log,
        name="environment_log",
    ),
    path(
        "repositories/<str:name>/remove/",
        repositories.repository_remove_view,
        name="repository_remove",
    ),
    path("", include("quanta.urls")),
    path("waves/start/", dashboard.wave_start_view, name="wave_start"),
    path("waves/", include("bursts.urls")),
    path("agents/", include("psychonauts.urls")),
    path("", include("tether.urls")),
    path("", include("autopilot.urls")),
    path("", include("reflection.urls")),
    path("hooks/", include("hooks.urls")),
    path("admin/", admin.site.urls),
    path("healthz", dashboard.healthz, name="healthz"),
    path("", include("operations.urls")),
]
