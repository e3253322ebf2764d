"""The embedded ActiveMQ writes a log in the state directory (issue 31: it wrote none, ``log4j:WARN No appenders``,
which hid the cause of a disk-full death and of the losses)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.node.services import EmbeddedActiveMQ, free_port

from stdclients import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="nsjms-amqlog-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_embedded_broker_writes_a_rotated_log_in_the_state_directory(state_dir: Path) -> None:
    broker = EmbeddedActiveMQ(state_dir, free_port(), free_port(), die_with_parent=True)
    broker.start()
    try:
        log = broker.broker_log
        assert log == state_dir / "activemq" / "data" / "activemq.log"

        def started() -> bool:
            return log.exists() and "started" in log.read_text(errors="replace")

        assert wait_until(started, 60), f"no broker log; console:\n{broker.console_log.read_text(errors='replace')}"
        text = log.read_text(errors="replace")
        assert "Apache ActiveMQ" in text and "INFO" in text, text[-2000:]
        assert "log4j:WARN No appenders" not in broker.console_log.read_text(errors="replace")
        config = (state_dir / "activemq" / "log4j.properties").read_text()
        assert "RollingFileAppender" in config and "MaxFileSize=10MB" in config and "MaxBackupIndex=5" in config
        assert (state_dir / "activemq" / "log4j.properties").stat().st_mode & 0o077 == 0
    finally:
        broker.stop()
    assert "stopped" in broker.broker_log.read_text(errors="replace").lower()
