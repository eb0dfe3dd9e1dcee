from __future__ import annotations

from django.urls import path

from hooks import views

urlpatterns = [
    path("github", views.github, name="hooks_github"),
]
