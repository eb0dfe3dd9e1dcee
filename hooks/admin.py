"""Webhook endpoints are made and changed here (through hooks.services.endpoints); the delivery
logs, in and out, are read-only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from core.admin import ReadOnly
from hooks.models import (
    GithubDelivery,
    GithubLink,
    HookEvent,
    WebhookDelivery,
    WebhookEndpoint,
)
from hooks.services.endpoints import endpoint_delete, endpoint_save, endpoint_url_problem


class EndpointForm(forms.ModelForm[WebhookEndpoint]):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=HookEvent.choices, widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["name", "url", "secret_env", "events", "active"]

    def clean_url(self) -> str:
        url = str(self.cleaned_data["url"])
        problem = endpoint_url_problem(url)
        if problem is not None:
            raise forms.ValidationError(problem)
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin[WebhookEndpoint]):
    form = EndpointForm
    list_display = ["name", "url", "secret_env", "events", "active", "created_at"]
    list_filter = ["active"]
    search_fields = ["name", "url"]

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool
    ) -> None:
        endpoint_save(endpoint=obj)

    def delete_model(self, request: HttpRequest, obj: WebhookEndpoint) -> None:
        endpoint_delete(endpoint_id=obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for pk in queryset.values_list("pk", flat=True):
            endpoint_delete(endpoint_id=pk)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly, admin.ModelAdmin[WebhookDelivery]):
    list_display = ["created_at", "endpoint", "event", "event_id", "status", "attempts",
                    "status_code", "error", "next_try_at", "delivered_at"]  # fmt: skip
    list_filter = ["status", "event", "endpoint"]
    list_select_related = ["endpoint"]
    search_fields = ["delivery_id", "error"]
    ordering = ["-created_at"]


@admin.register(GithubDelivery)
class GithubDeliveryAdmin(ReadOnly, admin.ModelAdmin[GithubDelivery]):
    list_display = ["received_at", "event", "action", "delivery_id", "outcome", "quantum"]
    list_filter = ["event"]
    search_fields = ["delivery_id", "outcome"]
    ordering = ["-received_at"]


@admin.register(GithubLink)
class GithubLinkAdmin(ReadOnly, admin.ModelAdmin[GithubLink]):
    list_display = ["key", "quantum", "updated_at"]
    search_fields = ["key"]
