from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from annihilation import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("quanta.urls")),
    path("waves/", include("bursts.urls")),
    path("agents/", include("psychonauts.urls")),
    path("", include("tether.urls")),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
]
