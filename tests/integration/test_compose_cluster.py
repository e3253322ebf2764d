"""deploy/compose.cluster.yaml (three nsjms nodes, one PostgreSQL, one broker) as docker-compose reads it.

There is no Docker engine on the development machines, so the stack itself is not started here; docker-compose's own
``config`` (which needs no engine) validates the file against its schema and interpolates it, and the test checks
what makes the three containers one cluster: distinct node ids, the same DSN and broker, one IIOP port each (the
same inside and outside, as the references carry it), published on the loopback only, PostgreSQL not published,
no default secrets. Marked ``containers`` (docker-compose is installed with the engine, scripts/docker-engine.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.containers]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.cluster.yaml"
NODES = ("nsjms1", "nsjms2", "nsjms3")


def _compose(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: apt-get install docker-compose (scripts/docker-engine.sh does)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NSJMS_", "ORB_"))}
    return subprocess.run(["docker-compose", "-f", str(COMPOSE_FILE), "-p", "nsjmsclustercheck", *args],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False)


def _services(text: str) -> dict[str, list[str]]:
    """The normalised output of ``docker-compose config``: each service's lines (its block under ``services:``)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_services = False
    for line in text.splitlines():
        if not line.startswith(" "):
            in_services = line == "services:"
            current = None
            continue
        if in_services and line.startswith("  ") and not line.startswith("   "):
            current = out.setdefault(line.strip().rstrip(":"), [])
        elif current is not None:
            current.append(line.strip())
    return out


def _value(lines: list[str], key: str) -> str:
    found = [line.split(":", 1)[1].strip().strip("'\"") for line in lines if line.startswith(f"{key}:")]
    assert len(found) == 1, (key, lines)
    return found[0]


def test_three_nodes_one_database_one_broker() -> None:
    secrets = {"NSJMS_PG_PASSWORD": "pg-secret", "NSJMS_BROKER_PASSCODE": "mq-secret"}
    out = _compose("config", **secrets)
    assert out.returncode == 0, out.stderr
    services = _services(out.stdout)
    assert set(services) == {"postgres", "activemq", *NODES}

    ids = {n: _value(services[n], "NSJMS_NODE_NODE_ID") for n in NODES}
    assert sorted(ids.values()) == ["node1", "node2", "node3"], "distinct node ids"
    for key in ("NSJMS_POSTGRES_DSN", "NSJMS_BROKER_URL", "NSJMS_CLUSTER_RENEW_S", "NSJMS_CLUSTER_EXPIRY_S"):
        assert len({_value(services[n], key) for n in NODES}) == 1, f"{key}: one value for every node"
    assert _value(services["nsjms1"], "NSJMS_POSTGRES_DSN").endswith("@postgres:5432/nsjms")
    ports = {n: _value(services[n], "NSJMS_ORB_PORT") for n in NODES}
    assert len(set(ports.values())) == 3, ports
    for n in NODES:
        published = [line for line in services[n] if line.startswith("- 127.0.0.1:")]
        assert published == [f"- 127.0.0.1:{ports[n]}:{ports[n]}/tcp"], (n, published)
        assert any(line.startswith(f"- state{n[-1]}:/var/lib/nsjms") for line in services[n]), "own state volume"
    assert not any(line.startswith("- ") and ":5432" in line for line in services["postgres"]), \
        "PostgreSQL is not published"
    assert all(not line.startswith("- 0.0.0.0") for lines in services.values() for line in lines)
    command = " ".join(services["postgres"])
    assert "tcp_keepalives_idle=5" in command and "tcp_user_timeout=10000" in command, \
        "PostgreSQL drops a silent (cut) node's sessions within seconds"

    moved = _compose("config", NSJMS_IIOP_PORT_2="3910", **secrets)
    assert moved.returncode == 0 and "- 127.0.0.1:3910:3910/tcp" in moved.stdout

    volumes = _compose("config", "--volumes", **secrets)
    assert set(volumes.stdout.split()) == {"pgdata", "amqdata", "state1", "state2", "state3"}


def test_no_default_secrets() -> None:
    out = _compose("config", "-q", NSJMS_BROKER_PASSCODE="mq-secret")
    assert out.returncode != 0 and "NSJMS_PG_PASSWORD" in out.stderr, out.stderr
    out = _compose("config", "-q", NSJMS_PG_PASSWORD="pg-secret")
    assert out.returncode != 0 and "NSJMS_BROKER_PASSCODE" in out.stderr, out.stderr
