"""router.node.config: precedence file < env < overrides, validation messages naming key and source, redaction."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from router.node.config import Config, ConfigError, load_config, redact_dsn

SECRET = "s3cr3t-Pa55"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nsjms.toml"
    path.write_text(text)
    return path


def test_defaults_without_file_or_env() -> None:
    config = load_config(env={})
    assert config == Config()
    assert (config.orb.host, config.orb.port, config.orb.max_threads) == ("127.0.0.1", 2809, 64)
    assert (config.node.state_dir, config.node.node_id, config.node.log_level) == (
        Path(".nsjms"),
        "node1",
        "INFO",
    )
    assert (config.postgres.dsn, config.postgres.embedded_port, config.postgres.pool_size) == ("", 55432, 8)
    assert config.postgres.embedded and config.broker.embedded
    assert (config.broker.embedded_stomp_port, config.broker.embedded_openwire_port) == (61613, 61616)


def test_file_then_env_then_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, '[orb]\nport = 3000\nmax_threads = 8\n[node]\nnode_id = "from-file"\n')
    env = {"NSJMS_ORB_PORT": "3001", "NSJMS_NODE_NODE_ID": "from-env"}
    config = load_config(path, env=env, overrides={"orb.port": 3002})
    assert config.orb.port == 3002  # override beats env beats file
    assert config.node.node_id == "from-env"  # env beats file
    assert config.orb.max_threads == 8  # file beats default
    assert config.orb.host == "127.0.0.1"  # default


def test_none_override_means_unset_flag(tmp_path: Path) -> None:
    config = load_config(env={"NSJMS_ORB_PORT": "3001"}, overrides={"orb.port": None})
    assert config.orb.port == 3001


def test_string_overrides_are_coerced_like_env() -> None:
    config = load_config(env={}, overrides={"orb.port": "2900", "node.log_level": "debug"})
    assert config.orb.port == 2900
    assert config.node.log_level == "DEBUG"


def test_config_file_from_nsjms_config_env(tmp_path: Path) -> None:
    path = write(tmp_path, "[postgres]\npool_size = 3\n")
    assert load_config(env={"NSJMS_CONFIG": str(path)}).postgres.pool_size == 3


def test_env_with_unknown_section_is_not_config() -> None:
    config = load_config(env={"NSJMS_TEST_PG_DSN": "x", "NSJMS_CONFIGX": "y", "OTHER_ORB_PORT": "z"})
    assert config == Config()


def test_state_dir_is_a_path_with_user_expanded() -> None:
    config = load_config(env={"NSJMS_NODE_STATE_DIR": "~/state"})
    assert config.node.state_dir == Path("~/state").expanduser()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"NSJMS_ORB_PORT": "abc"}, "orb.port (from NSJMS_ORB_PORT): expected an integer 1-65535, got 'abc'"),
        ({"NSJMS_ORB_PORT": "0"}, "orb.port (from NSJMS_ORB_PORT): expected an integer 1-65535, got '0'"),
        ({"NSJMS_ORB_PORT": "65536"}, "orb.port (from NSJMS_ORB_PORT): expected an integer 1-65535"),
        (
            {"NSJMS_POSTGRES_EMBEDDED_PORT": "-1"},
            "postgres.embedded_port (from NSJMS_POSTGRES_EMBEDDED_PORT)",
        ),
        (
            {"NSJMS_POSTGRES_POOL_SIZE": "0"},
            "postgres.pool_size (from NSJMS_POSTGRES_POOL_SIZE): expected an integer",
        ),
        ({"NSJMS_ORB_MAX_THREADS": "many"}, "orb.max_threads (from NSJMS_ORB_MAX_THREADS)"),
        (
            {"NSJMS_NODE_NODE_ID": "bad id!"},
            "node.node_id (from NSJMS_NODE_NODE_ID): expected 1-32 characters",
        ),
        ({"NSJMS_NODE_NODE_ID": "x" * 33}, "node.node_id (from NSJMS_NODE_NODE_ID)"),
        (
            {"NSJMS_NODE_LOG_LEVEL": "LOUD"},
            "node.log_level (from NSJMS_NODE_LOG_LEVEL): expected one of DEBUG",
        ),
        (
            {"NSJMS_NODE_STATE_DIR": " "},
            "node.state_dir (from NSJMS_NODE_STATE_DIR): expected a non-empty path",
        ),
        ({"NSJMS_ORB_HOST": "bad host"}, "orb.host (from NSJMS_ORB_HOST): expected a host name"),
        ({"NSJMS_BROKER_URL": "not a url"}, "broker.url (from NSJMS_BROKER_URL): expected a URL"),
        ({"NSJMS_BROKER_URL": "stomp://h:70000"}, "broker.url (from NSJMS_BROKER_URL): expected a URL"),
        (
            {"NSJMS_POSTGRES_DSN": "mysql://u@h/db"},
            "postgres.dsn (from NSJMS_POSTGRES_DSN): expected a postgresql",
        ),
        ({"NSJMS_POSTGRES_DSN": "host=h bogus"}, "postgres.dsn (from NSJMS_POSTGRES_DSN)"),
        (
            {"NSJMS_BROKER_EMBEDDED_STOMP_PORT": "61616"},
            "broker.embedded_stomp_port (from NSJMS_BROKER_EMBEDDED_STOMP_PORT): must differ",
        ),
        ({"NSJMS_ORB_PROT": "1"}, "orb.prot (from NSJMS_ORB_PROT): unknown key"),
    ],
)
def test_env_errors_name_key_and_source(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert str(info.value).startswith(expected)
    assert info.value.source in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[orb]\nport = "2809"\n', "orb.port (from {path}): expected an integer 1-65535, got '2809'"),
        ("[orb]\nport = true\n", "orb.port (from {path}): expected an integer 1-65535, got True"),
        ("[orb]\nport = 2809.0\n", "orb.port (from {path}): expected an integer"),
        ("[broker]\nlogin = 5\n", "broker.login (from {path}): expected a string, got 5"),
        ("[node]\nstate_dir = 1\n", "node.state_dir (from {path}): expected a non-empty path"),
        ('[nodes]\nnode_id = "a"\n', "[nodes] (from {path}): unknown section"),
        ('[node]\nnodeid = "a"\n', "node.nodeid (from {path}): unknown key"),
        ('node_id = "a"\n', "node_id (from {path}): unknown top-level key"),
        ("[orb\n", "{path}: invalid TOML"),
    ],
)
def test_file_errors_name_key_and_source(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(expected.format(path=path))


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(tmp_path / "absent.toml", env={})


def test_override_errors_name_the_override() -> None:
    with pytest.raises(ConfigError, match=r"^orb\.port \(from command line orb\.port\): expected an integer"):
        load_config(env={}, overrides={"orb.port": "x"})
    with pytest.raises(ConfigError, match=r"^orb\.port \(from --orb-port orb\.port\)"):
        load_config(env={}, overrides={"orb.port": 99999}, override_source="--orb-port")
    with pytest.raises(ConfigError, match=r"^\[bogus\] \(from command line bogus\.key\): unknown section"):
        load_config(env={}, overrides={"bogus.key": 1})


def test_config_error_pickles() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"NSJMS_ORB_PORT": "x"})
    clone = pickle.loads(pickle.dumps(info.value))
    assert (str(clone), clone.key, clone.source) == (str(info.value), "orb.port", "NSJMS_ORB_PORT")


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (f"postgresql://user:{SECRET}@db.example:5432/nsjms", "postgresql://user:***@db.example:5432/nsjms"),
        (
            f"postgres://user:{SECRET}@h1:5432,h2:5433/db?sslmode=require",
            "postgres://user:***@h1:5432,h2:5433/db?sslmode=require",
        ),
        (
            f"postgresql://user@h/db?password={SECRET}&sslmode=disable",
            "postgresql://user@h/db?password=***&sslmode=disable",
        ),
        (f"host=h user=u password={SECRET} dbname=d", "host=h user=u password=*** dbname=d"),
        (f"host=h password = '{SECRET} with \\' quote' dbname=d", "host=h password = *** dbname=d"),
        (f"host=h PASSWORD={SECRET}", "host=h PASSWORD=***"),
        (f"stomp://admin:{SECRET}@broker:61613", "stomp://admin:***@broker:61613"),
        ("postgresql://h:5432/db", "postgresql://h:5432/db"),
        ("host=h dbname=d", "host=h dbname=d"),
        ("", ""),
    ],
)
def test_redact_dsn(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected
    assert SECRET not in redact_dsn(dsn)


def test_redacted_and_repr_never_show_secrets() -> None:
    env = {
        "NSJMS_POSTGRES_DSN": f"postgresql://nsjms:{SECRET}@db/nsjms",
        "NSJMS_BROKER_URL": "stomp://broker:61613",
        "NSJMS_BROKER_LOGIN": "amq",
        "NSJMS_BROKER_PASSCODE": SECRET,
    }
    config = load_config(env=env)
    assert config.broker.passcode == SECRET and SECRET in config.postgres.dsn  # the real values are kept
    shown = config.redacted()
    assert SECRET not in repr(shown) and SECRET not in repr(config) and SECRET not in str(config)
    assert shown["broker"]["passcode"] == "***"
    assert shown["broker"]["login"] == "amq"
    assert shown["postgres"]["dsn"] == "postgresql://nsjms:***@db/nsjms"
    assert shown["broker"]["url"] == "stomp://broker:61613"
    assert shown["node"]["state_dir"] == ".nsjms"


def test_empty_passcode_is_shown_empty() -> None:
    assert load_config(env={}).redacted()["broker"]["passcode"] == ""


@pytest.mark.parametrize("value", [f"{SECRET} not a dsn", f"host=h password={SECRET} junk"])
def test_invalid_dsn_error_does_not_leak_password(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"NSJMS_POSTGRES_DSN": value})
    assert "postgres.dsn (from NSJMS_POSTGRES_DSN)" in str(info.value)
    assert SECRET not in str(info.value)


def test_invalid_broker_url_error_does_not_leak_password() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"NSJMS_BROKER_URL": f"stomp://u:{SECRET}@h:99999"})
    assert SECRET not in str(info.value)


def test_passcode_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={"broker.passcode": 12345})
    assert str(
        info.value
    ) == "broker.passcode (from command line broker.passcode): expected a string, got '***'"


def test_sample_deploy_config_is_valid_and_documents_the_defaults() -> None:
    sample = Path(__file__).resolve().parents[2] / "deploy" / "nsjms.toml"
    config = load_config(sample, env={})
    assert config.node.state_dir == Path("/var/lib/nsjms")
    assert (
        config.orb == Config().orb
        and config.postgres == Config().postgres
        and config.broker == Config().broker
        and config.ledger == Config().ledger
        and config.telemetry == Config().telemetry
    )


def test_ledger_section_defaults_file_env_and_errors(tmp_path: Path) -> None:
    from router.node.config import LedgerConfig

    assert load_config(env={}).ledger == LedgerConfig(True, False, 30, 3, 3600)
    path = write(tmp_path, "[ledger]\nenabled = false\nretention_days = 7\n")
    config = load_config(path, env={"NSJMS_LEDGER_BEST_EFFORT": "true", "NSJMS_LEDGER_AHEAD_DAYS": "1"})
    assert config.ledger == LedgerConfig(enabled=False, best_effort=True, retention_days=7, ahead_days=1)
    for env, expected in [
        ({"NSJMS_LEDGER_ENABLED": "maybe"},
         "ledger.enabled (from NSJMS_LEDGER_ENABLED): expected a boolean (true/false)"),
        ({"NSJMS_LEDGER_RETENTION_DAYS": "0"}, "ledger.retention_days (from NSJMS_LEDGER_RETENTION_DAYS): expected "
                                               "an integer 1-36500"),
        ({"NSJMS_LEDGER_MAINTENANCE_INTERVAL_S": "5"}, "ledger.maintenance_interval_s"),
        ({"NSJMS_LEDGER_RETENTION": "3"}, "ledger.retention (from NSJMS_LEDGER_RETENTION): unknown key"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(expected)):
            load_config(env=env)
    with pytest.raises(ConfigError, match=re.escape("ledger.enabled (from ")):
        load_config(write(tmp_path, '[ledger]\nenabled = "yes"\n'), env={})   # TOML has real booleans


def test_cluster_section_defaults_env_and_the_lease_must_survive_two_missed_renewals(tmp_path: Path) -> None:
    from router.node.config import ClusterConfig

    assert load_config(env={}).cluster == ClusterConfig(2, 20)       # ActiveMQ Artemis's JDBC lease
    config = load_config(env={"NSJMS_CLUSTER_RENEW_S": "1", "NSJMS_CLUSTER_EXPIRY_S": "3"})
    assert config.cluster == ClusterConfig(renew_s=1, expiry_s=3)
    with pytest.raises(ConfigError, match=re.escape("cluster.expiry_s (from NSJMS_CLUSTER_EXPIRY_S): "
                                                    "cluster.expiry_s must be at least 3 x cluster.renew_s (6)")):
        load_config(env={"NSJMS_CLUSTER_RENEW_S": "2", "NSJMS_CLUSTER_EXPIRY_S": "5"})
    path = write(tmp_path, "[cluster]\nrenew_s = 10\n")                   # the default expiry 20 < 3 x 10
    with pytest.raises(ConfigError, match=re.escape(f"cluster.renew_s (from {path}): cluster.expiry_s must be")):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=re.escape("cluster.renew_s (from NSJMS_CLUSTER_RENEW_S): expected an "
                                                    "integer 1-60")):
        load_config(env={"NSJMS_CLUSTER_RENEW_S": "0"})


# ------------------------------------------------------------------ schemes checked at configuration time (issue 7)
@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("NSJMS_BROKER_URL", "http://x:1", "broker.url (from NSJMS_BROKER_URL): unsupported scheme 'http://'"),
        ("NSJMS_BROKER_URL", "tcp://127.0.0.1:61616", "broker.url (from NSJMS_BROKER_URL): unsupported scheme"),
        ("NSJMS_BROKER_URL", "memory://x", "broker.url (from NSJMS_BROKER_URL): unsupported scheme"),
        ("NSJMS_BROKER_URL", "stomp://h", "broker.url (from NSJMS_BROKER_URL): expected a URL stomp://HOST:PORT"),
        ("NSJMS_BROKER_URL", "stomp://h:1/queue", "broker.url (from NSJMS_BROKER_URL): expected a URL"),
        ("NSJMS_BROKER_URL", "stomp://h:1,h2", "broker.url (from NSJMS_BROKER_URL): expected a URL"),
        ("NSJMS_POSTGRES_DSN", "http://x:1", "postgres.dsn (from NSJMS_POSTGRES_DSN): expected a postgresql"),
        ("NSJMS_POSTGRES_DSN", "stomp://x:1", "postgres.dsn (from NSJMS_POSTGRES_DSN): expected a postgresql"),
    ],
)
def test_service_url_schemes_are_checked_at_load_time(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={key: value})
    assert str(info.value).startswith(expected)


@pytest.mark.parametrize(
    "value",
    ["stomp://127.0.0.1:61613", "stomp+ssl://amq.example:61614", "STOMP://h:1", "stomp://a:1,b:2",
     "stomp://[::1]:61613"],
)
def test_supported_broker_urls(value: str) -> None:
    assert load_config(env={"NSJMS_BROKER_URL": value}).broker.url == value


@pytest.mark.parametrize(
    "value", ["postgresql://u@h:5/db", "postgres://h/db", "host=h port=5 dbname=db", "dbname=nsjms"]
)
def test_supported_dsns(value: str) -> None:
    assert load_config(env={"NSJMS_POSTGRES_DSN": value}).postgres.dsn == value


def test_credentials_in_the_broker_url_are_refused_without_echo() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"NSJMS_BROKER_URL": f"stomp://amq:{SECRET}@broker:61613"})
    assert str(info.value).startswith("broker.url (from NSJMS_BROKER_URL): credentials do not belong in the URL")
    assert SECRET not in str(info.value)


def test_connect_timeouts() -> None:
    config = load_config(env={"NSJMS_POSTGRES_CONNECT_TIMEOUT_S": "3"})
    assert (config.postgres.connect_timeout_s, config.broker.connect_timeout_s) == (3, 10)
    with pytest.raises(ConfigError, match=r"broker.connect_timeout_s \(from NSJMS_BROKER_CONNECT_TIMEOUT_S\)"):
        load_config(env={"NSJMS_BROKER_CONNECT_TIMEOUT_S": "0"})


def test_cli_refuses_an_http_broker_url_with_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from router.cli import EXIT_CONFIG, main

    state = tmp_path / "nsjms"
    # explicit DSN and ORB port: code that accepted the URL would fail on them without starting embedded services
    argv = ["serve", "--broker-url", "http://x:1", "--state-dir", str(state), "--pg-dsn",
            "postgresql://u@127.0.0.1:1/x", "--orb-port", "1"]
    assert main(argv) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "broker.url (from command line broker.url): unsupported scheme 'http://'" in err
    assert not state.exists()


def test_relative_state_dir_in_a_file_is_relative_to_that_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    conf = conf_dir / "nsjms.toml"
    conf.write_text('[node]\nstate_dir = "state"\n')
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(conf, env={})
    assert cfg.node.state_dir == conf_dir.resolve() / "state"


def test_telemetry_exporters_off_by_default_and_loopback() -> None:
    tel = load_config(env={}).telemetry
    assert (tel.exporter, tel.address, tel.otlp_endpoint) == ("none", "127.0.0.1:9464", "http://127.0.0.1:4318")
    tel = load_config(env={"NSJMS_TELEMETRY_EXPORTER": "Prometheus", "NSJMS_TELEMETRY_ADDRESS": "[::1]:9000",
                           "NSJMS_TELEMETRY_OTLP_ENDPOINT": "https://collector:4318"}).telemetry
    assert (tel.exporter, tel.address, tel.otlp_endpoint) == ("prometheus", "[::1]:9000", "https://collector:4318")


@pytest.mark.parametrize(("env", "expected"), [
    ({"NSJMS_TELEMETRY_EXPORTER": "zipkin"}, "telemetry.exporter (from NSJMS_TELEMETRY_EXPORTER): expected one of"),
    ({"NSJMS_TELEMETRY_ADDRESS": "9464"}, "telemetry.address (from NSJMS_TELEMETRY_ADDRESS): expected HOST:PORT"),
    ({"NSJMS_TELEMETRY_ADDRESS": "localhost:70000"}, "expected HOST:PORT"),
    ({"NSJMS_TELEMETRY_OTLP_ENDPOINT": "grpc://x:4317"}, "telemetry.otlp_endpoint (from NSJMS_TELEMETRY_OTLP"),
])
def test_telemetry_errors_name_the_key(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_config(env=env)


def test_broker_amq_dupl_id_is_a_boolean_off_by_default(tmp_path: Path) -> None:
    assert load_config(env={}).broker.amq_dupl_id is False
    assert load_config(env={"NSJMS_BROKER_AMQ_DUPL_ID": "true"}).broker.amq_dupl_id is True
    path = tmp_path / "nsjms.toml"
    path.write_text("[broker]\namq_dupl_id = false\n")
    assert load_config(path, env={}).broker.amq_dupl_id is False
    with pytest.raises(ConfigError, match=r"broker\.amq_dupl_id"):
        load_config(env={"NSJMS_BROKER_AMQ_DUPL_ID": "maybe"})


def test_cluster_peers_are_host_port_addresses_from_a_file_or_the_environment(tmp_path: Path) -> None:
    assert load_config(env={}).cluster.peers == ()
    assert load_config(env={"NSJMS_CLUSTER_PEERS": "10.0.0.2:2809, 10.0.0.3:2809"}).cluster.peers == \
        ("10.0.0.2:2809", "10.0.0.3:2809")
    path = write(tmp_path, '[cluster]\npeers = ["n2.example:2809", "[::1]:2810"]\n')
    assert load_config(path, env={}).cluster.peers == ("n2.example:2809", "[::1]:2810")
    for bad in ("10.0.0.2", "10.0.0.2:0", "10.0.0.2:x", "a b:1"):
        with pytest.raises(ConfigError, match=re.escape("cluster.peers (from NSJMS_CLUSTER_PEERS): expected "
                                                        "HOST:PORT addresses")):
            load_config(env={"NSJMS_CLUSTER_PEERS": bad})
