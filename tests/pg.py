"""PostgreSQL for tests: an admin connection (or a LOUD skip), and throwaway schemas owned by an
ordinary role, because PostgreSQL skips row-level security for superusers even with FORCE.

Set SIDECAR_TEST_PG_DSN to point elsewhere (default: host=127.0.0.1 port=5432 dbname=test user=postgres)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG_DSN = os.environ.get("SIDECAR_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres")
PG_APP_ROLE = "sidecar_store_app"  # an ordinary role: RLS applies to it


# ---------------------------------------------------------------------------- PostgreSQL helpers
def pg_admin():
    """An autocommit admin connection, or a LOUD skip when PostgreSQL is unreachable."""
    try:
        import psycopg
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"!!!!! POSTGRES BACKEND NOT TESTED: psycopg is not installed ({e}) !!!!!")
    try:
        return psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"!!!!! POSTGRES BACKEND NOT TESTED: PostgreSQL unreachable at {PG_DSN!r} "
                    f"(set SIDECAR_TEST_PG_DSN): {str(e).strip()} !!!!!")


def pg_app_dsn() -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(PG_DSN, user=PG_APP_ROLE)


def pg_create_schema(admin, prefix: str) -> str:
    """A fresh schema owned by the ordinary app role (created if missing)."""
    import psycopg

    try:
        admin.execute(f"CREATE ROLE {PG_APP_ROLE} LOGIN NOSUPERUSER NOBYPASSRLS")
    except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        pass
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin.execute(f"CREATE SCHEMA {name} AUTHORIZATION {PG_APP_ROLE}")
    return name


def pg_drop_schema(admin, name: str) -> None:
    admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def pg_url(schema: str, *, app_role: bool = True) -> str:
    """A postgres:// URL for `python -m sidecar serve --store` on that schema."""
    user = PG_APP_ROLE if app_role else "postgres"
    return f"postgresql://{user}@127.0.0.1:5432/test?schema={schema}"


@contextmanager
def pg_throwaway_schema(prefix: str) -> Iterator[str]:
    """A fresh schema for the block (pg_create_schema), dropped after it."""
    admin = pg_admin()
    name = pg_create_schema(admin, prefix)
    try:
        yield name
    finally:
        pg_drop_schema(admin, name)
        admin.close()
