"""API tokens in the admin: created through a form that shows the token once, revoked with an
action; the stored hash is never shown and a token is never edited."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from api.errors import ApiError
from api.models import ApiToken, IdempotentResponse, TokenScope
from api.services import token_create, token_revoke


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="which client the token is for")
    scopes = forms.MultipleChoiceField(
        choices=TokenScope.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=[TokenScope.READ],
    )


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = ["id", "name", "scopes", "shown_prefix", "created_at", "last_used_at", "state"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    readonly_fields = ("name", "scopes", "shown_prefix", "created_by", "created_at",
                       "last_used_at", "revoked_at", "revoked_by")  # fmt: skip
    fields = readonly_fields
    actions = ["revoke"]

    @admin.display(description="token starts")
    def shown_prefix(self, obj: ApiToken) -> str:
        return f"ann_{obj.prefix}_…"

    @admin.display(description="state")
    def state(self, obj: ApiToken) -> str:
        return "active" if obj.active else "revoked"

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoked, not deleted: the record of who had access stays

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            return redirect("admin:api_apitoken_changelist")
        form = TokenCreateForm(request.POST or None)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Create an API token",
            "form": form,
        }
        if request.method == "POST" and form.is_valid():
            try:
                made = token_create(
                    name=form.cleaned_data["name"],
                    scopes=form.cleaned_data["scopes"],
                    by=request.user.get_username(),
                )
            except ApiError as exc:
                form.add_error(None, str(exc))
            else:
                context.update(title="API token created", token=made.token, secret=made.secret)
                response = TemplateResponse(request, "admin/api/apitoken/created.html", context)
                response["Cache-Control"] = "no-store"
                return response
        return TemplateResponse(request, "admin/api/apitoken/add.html", context)

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = 0
        for token_id in queryset.filter(revoked_at__isnull=True).values_list("pk", flat=True):
            try:
                token_revoke(token_id=token_id, by=request.user.get_username())
            except ApiError as exc:
                self.message_user(request, str(exc), messages.WARNING)
            else:
                revoked += 1
        self.message_user(request, f"{revoked} token(s) revoked")


@admin.register(IdempotentResponse)
class IdempotentResponseAdmin(admin.ModelAdmin[IdempotentResponse]):
    list_display = ["id", "token", "key", "operation", "status_code", "created_at"]
    list_select_related = ["token"]
    search_fields = ["key"]
    readonly_fields = ["token", "key", "operation", "request_sha256", "status_code", "body",
                       "created_at"]  # fmt: skip

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # api.services.idempotency_purge forgets them after the retention
