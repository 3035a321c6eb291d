"""The reads every request makes to authenticate and authorize: the user's tenant, a knox token by
key, a user's permissions — one prepared statement each, kept apart from the run's write path."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_backends, get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from knox.models import get_token_model

from runs.models import Tenant
from runs.store.cursor import statement_cursor
from runs.store.reads import columns_of, model_from_row


def member_tenant(user_id: Any) -> Any:
    """The tenant the user is a member of (a Tenant), or None: one prepared
    read, asked on every API request (the permission check) and every page."""
    with statement_cursor() as cursor:
        cursor.execute(
            f"SELECT {columns_of(Tenant, 't')} FROM tenants t JOIN memberships m ON m.tenant_id = t.id"
            " WHERE m.user_id = %s",
            [user_id],
        )
        row = cursor.fetchone()
    return None if row is None else model_from_row(Tenant, row)


def tokens_with_key(token_key: str) -> list[Any]:
    """knox's tokens whose key is `token_key`, each with its user loaded, in
    one prepared read (what knox's authentication reads through the ORM)."""
    token_model, user_model = get_token_model(), get_user_model()
    fk = token_model._meta.get_field("user")
    quote = connection.ops.quote_name
    with statement_cursor() as cursor:
        cursor.execute(
            f"SELECT {columns_of(token_model, 't')}, {columns_of(user_model, 'u')}"
            f" FROM {quote(token_model._meta.db_table)} t"
            f" JOIN {quote(user_model._meta.db_table)} u ON u.{quote(fk.target_field.column)} = t.{quote(fk.column)}"
            f" WHERE t.{quote(token_model._meta.get_field('token_key').column)} = %s",
            [token_key],
        )
        rows = cursor.fetchall()
    width = len(token_model._meta.concrete_fields)
    tokens = []
    for row in rows:
        token = model_from_row(token_model, row[:width])
        token.user = model_from_row(user_model, row[width:])
        tokens.append(token)
    return tokens


def granted_permissions(user: Any) -> list[str]:
    """`user.get_all_permissions()`, sorted. When Django's ModelBackend is the
    one configured backend that grants permissions (the default), in one
    hand-written, prepared read instead of its two ORM queries (about 4 ms
    of a REST submit, which stamps the principal's permissions on the run);
    any other configuration asks the backends."""
    granting = [b for b in get_backends() if hasattr(b, "get_all_permissions")]
    if len(granting) != 1 or type(granting[0]) is not ModelBackend:
        return sorted(user.get_all_permissions())
    if not user.is_active or user.is_anonymous:
        return []
    quote = connection.ops.quote_name
    perms, groups = (user._meta.get_field(name) for name in ("user_permissions", "groups"))  # (user may be lazy)
    group_perms = Group._meta.get_field("permissions")
    # (m2m_column_name: the through table's column naming the owner; m2m_reverse_name: the other side)
    sql = (
        f"SELECT ct.app_label, p.codename FROM {quote(Permission._meta.db_table)} p"
        f" JOIN {quote(ContentType._meta.db_table)} ct ON ct.id = p.content_type_id"
    )
    params: list[Any] = []
    if not user.is_superuser:  # a superuser has every permission
        sql += (
            f" WHERE p.id IN (SELECT {quote(perms.m2m_reverse_name())} FROM {quote(perms.m2m_db_table())}"
            f" WHERE {quote(perms.m2m_column_name())} = %s"
            f" UNION SELECT gp.{quote(group_perms.m2m_reverse_name())} FROM {quote(group_perms.m2m_db_table())} gp"
            f" JOIN {quote(groups.m2m_db_table())} ug"
            f" ON ug.{quote(groups.m2m_reverse_name())} = gp.{quote(group_perms.m2m_column_name())}"
            f" WHERE ug.{quote(groups.m2m_column_name())} = %s)"
        )
        params = [user.pk, user.pk]
    with statement_cursor() as cursor:
        cursor.execute(sql, params)
        return sorted({f"{app_label}.{codename}" for app_label, codename in cursor.fetchall()})
