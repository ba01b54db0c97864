"""The list of routes the Go test TestEveryWithruntimeRouteIsKnown walks
(internal/api/testdata/withruntime_routes.txt) is every route the installed
withruntime can call: extracted again from its source here, it must match,
and no request call in the SDK may be left unread."""
from __future__ import annotations

import pytest

withruntime = pytest.importorskip("withruntime")

import withruntime_routes  # noqa: E402 - after the skip: it reads the SDK


def test_route_list_is_the_installed_sdks():
    routes, unresolved = withruntime_routes.extract(withruntime_routes.installed())
    assert not unresolved, "request calls whose path the extractor cannot read:\n" + "\n".join(unresolved)
    listed = withruntime_routes.read_list()
    missing, stale = sorted(routes - listed), sorted(listed - routes)
    assert not missing and not stale, (
        f"withruntime {withruntime.__version__}: the list differs from the SDK; run "
        f"python3 tests/conformance/withruntime_routes.py --write\nmissing: {missing}\nstale: {stale}")
    # The three the issue named are in it (the extractor reads helpers,
    # f-strings and literals alike).
    for r in ("POST /v1/webhook-deliveries/{}:retry", "POST /v1/job-imports", "GET /v1/sandboxes/{}/processes/{}/files"):
        assert r in routes
