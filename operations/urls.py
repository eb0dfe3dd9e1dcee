from __future__ import annotations

from django.urls import path

from operations import views

urlpatterns = [
    path("metrics", views.metrics_view, name="metrics"),
    path("operations/metrics/", views.metrics_page, name="metrics_page"),
]
