"""Fixtures the residency's tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.upstream.triton import MemberAdmin


@pytest.fixture
async def admin() -> AsyncIterator[MemberAdmin]:
    """The one admin client toward members, closed after the test."""
    async with httpx.AsyncClient(timeout=10.0) as client:
        admin = MemberAdmin(client, call_timeout_s=10.0)
        try:
            yield admin
        finally:
            await admin.close()
