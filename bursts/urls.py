from __future__ import annotations

from django.urls import path

from bursts import views

urlpatterns = [
    path("", views.waves, name="waves"),
    path("<int:wave_id>/", views.wave_page, name="wave"),
    path("<int:wave_id>/cancel/", views.wave_cancel_view, name="wave_cancel"),
]
