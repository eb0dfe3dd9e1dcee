from __future__ import annotations

from django.urls import path

from quanta import views

urlpatterns = [
    path("quanta/", views.quanta_index, name="quanta"),
    path("quanta/import/", views.quanta_import_upload, name="quanta_import"),
    path("quanta/export/", views.quanta_export_download, name="quanta_export"),
    path("quanta/new/", views.quantum_create, name="quantum_create"),
    path("quanta/<int:quantum_id>/edit/", views.quantum_edit, name="quantum_edit"),
    path("quanta/<int:quantum_id>/comment/", views.quantum_comment, name="quantum_comment"),
    path("quanta/<int:quantum_id>/close/", views.quantum_close, name="quantum_close"),
    path("quanta/<int:quantum_id>/reopen/", views.quantum_reopen, name="quantum_reopen"),
    path("quanta/<int:quantum_id>/defer/", views.quantum_defer, name="quantum_defer"),
    path(
        "quanta/<int:quantum_id>/dependencies/",
        views.quantum_dependency_add,
        name="quantum_dependency_add",
    ),
    path(
        "quanta/<int:quantum_id>/dependencies/remove/",
        views.quantum_dependency_remove,
        name="quantum_dependency_remove",
    ),
]
