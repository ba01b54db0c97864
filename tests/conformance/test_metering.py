"""Metering through the real `withruntime==0.35.0` SDK: a sandbox's metrics,
the account's usage and its export, the comparison with a rival's prices,
`me` and `limits` (issue 10)."""
from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone

import pytest
from _helpers import ok as _ok, poll as _poll
from withruntime import Sandbox

BURN = """python3 -c '
import time
t = time.process_time()
while time.process_time() - t < 2:
    pass'"""


@pytest.fixture(scope="module")
def metered(runtime_client):
    """A sandbox that burned 2 guest CPU-seconds and was stopped: its usage is settled."""
    box = Sandbox.create(client=runtime_client, timeout_seconds=1800)
    _ok(box.exec(BURN, timeout_ms=120_000), "burn")
    # Its metrics have a point once the server has read it (every 15 s by default).
    points = _poll(lambda: box.metrics(range="15m")["latest"], timeout_s=60, interval_s=2)
    metrics = box.metrics(range="1h")
    box.stop()
    yield box, metrics, points
    try:
        box.delete()
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the test result
        print(f"cleanup: delete of {box.id} failed: {e}")


def test_sandbox_metrics(metered):
    box, m, latest = metered
    assert latest, "no metrics point within a minute"
    assert m["stepSeconds"] == 60 and m["range"] == "1h", m
    assert m["vcpu"] == box.info["vcpu"]
    assert m["memoryLimitBytes"] == box.info["memoryMiB"] << 20
    measured = [p for p in m["points"] if p["cpuPercent"] is not None]
    assert measured, m["points"]
    assert all(p["memoryBytes"] > 16 << 20 for p in measured), measured
    assert any(p["cpuPercent"] > 0 for p in measured), measured


def test_usage_names_the_sandbox_and_prices_it(runtime_client, metered):
    box, _, _ = metered
    u = runtime_client.usage()
    group = next(g for g in u["groups"] if g["key"] == box.id)
    assert float(group["activeCpuSeconds"]) >= 1.8, group  # the host saw the 2 s burn
    assert float(group["guestCpuSeconds"]) >= 1.8, group
    assert float(group["runningSeconds"]) > 0 and float(group["memoryGiBSeconds"]) > 0, group
    parts = sum(int(group[k]) for k in ("cpuMicros", "memoryMicros", "storageMicros", "snapshotMicros"))
    assert abs(int(group["chargedMicros"]) - parts) <= 2, group  # each figure is rounded once
    assert u["rates"]["cpuPerVcpuHour"] == "0.025" and u["rates"]["memoryPerGiBHour"] == "0.0075"
    assert int(u["spent"]) >= int(group["chargedMicros"])
    # The sandbox object carries the same charge.
    assert box.refresh().info["chargedMicros"] == group["chargedMicros"]


def test_usage_export_pages(runtime_client, metered):
    box, _, _ = metered
    now = datetime.now(timezone.utc)
    since = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    until = (now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    text, cursor, pages = "", None, 0
    while True:
        page = runtime_client.usage_export(since, until, cursor=cursor, limit=1)
        text += page["csv"]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None or pages > 500:
            break
    rows = list(csv.DictReader(io.StringIO(text)))
    mine = [r for r in rows if r["resource_id"] == box.id]
    assert mine, rows[:3]
    assert sum(float(r["active_cpu_seconds"]) for r in mine) >= 1.8


def test_compare_with_e2b(runtime_client, metered):
    c = runtime_client.switching.compare("e2b")
    assert c["provider"] == "e2b" and c["basis"] in ("settled", "example"), c
    runtime, rival = int(c["runtimeMicros"]), int(c["rivalMicros"])
    assert int(c["savingMicros"]) == rival - runtime
    assert rival > runtime > 0, c
    assert "perMonth" in c and int(c["perMonth"]["rivalMicros"]) > 0


def test_me_and_limits(runtime_client):
    me = runtime_client.me()
    assert me["orgName"] and me["keyId"], me
    lim = runtime_client.limits.get()
    assert lim["access"] == "full"
    assert {row["limit"] for row in lim["account"]} >= {"sandbox.count", "sandbox.memory_mib"}
    assert int(lim["daily"]["usedMicros"]) >= 0
