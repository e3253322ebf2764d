-- 0001: the schema of nsjms before versioned migrations (channel, filters, bridges).
-- A database created by that version (these objects exist, no nsjms_schema_version) is adopted as version 1.

-- channel topology and persistent events (router/channel/store.py)
CREATE SEQUENCE nsjms_channel_id START WITH 0 MINVALUE 0;
CREATE TABLE nsjms_channel (
    id            integer PRIMARY KEY,
    qos           jsonb   NOT NULL,
    admin_props   jsonb   NOT NULL,
    next_admin_c  integer NOT NULL DEFAULT 1,
    next_admin_s  integer NOT NULL DEFAULT 1,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE nsjms_admin (
    channel_id    integer NOT NULL REFERENCES nsjms_channel(id) ON DELETE CASCADE,
    side          char(1) NOT NULL CHECK (side IN ('C','S')),
    id            integer NOT NULL,
    es_style      boolean NOT NULL DEFAULT false,
    operator      smallint NOT NULL DEFAULT 0,
    qos           jsonb   NOT NULL,
    next_proxy    integer NOT NULL DEFAULT 0,
    filters       jsonb   NOT NULL DEFAULT '{}'::jsonb,
    extra         jsonb   NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (channel_id, side, id)
);
CREATE TABLE nsjms_proxy (
    channel_id    integer NOT NULL,
    side          char(1) NOT NULL CHECK (side IN ('C','S')),
    admin_id      integer NOT NULL,
    id            integer NOT NULL,
    kind          text    NOT NULL,
    es_style      boolean NOT NULL DEFAULT false,
    qos           jsonb   NOT NULL,
    client_ior    text,
    connected     boolean NOT NULL DEFAULT false,
    suspended     boolean NOT NULL DEFAULT false,
    filters       jsonb   NOT NULL DEFAULT '{}'::jsonb,
    extra         jsonb   NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (channel_id, side, admin_id, id),
    FOREIGN KEY (channel_id, side, admin_id) REFERENCES nsjms_admin(channel_id, side, id) ON DELETE CASCADE
);
CREATE TABLE nsjms_event (
    id            bigserial PRIMARY KEY,
    channel_id    integer NOT NULL REFERENCES nsjms_channel(id) ON DELETE CASCADE,
    seq           bigint  NOT NULL,
    form          smallint NOT NULL,
    body          bytea   NOT NULL,
    priority      integer NOT NULL,
    deadline      double precision,
    start_at      double precision,
    received_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE nsjms_queue (
    channel_id    integer NOT NULL,
    admin_id      integer NOT NULL,
    proxy_id      integer NOT NULL,
    event_id      bigint  NOT NULL REFERENCES nsjms_event(id) ON DELETE CASCADE,
    PRIMARY KEY (channel_id, admin_id, proxy_id, event_id)
);
CREATE INDEX nsjms_queue_event ON nsjms_queue(event_id);

-- filters (router/channel/filters.py)
CREATE SEQUENCE nsjms_filter_id START WITH 1;
CREATE TABLE nsjms_filter (
    id            bigint  PRIMARY KEY,
    kind          char(1) NOT NULL CHECK (kind IN ('F','M')),
    grammar       text    NOT NULL,
    default_value text,
    next_cid      integer NOT NULL DEFAULT 1,
    constraints   jsonb   NOT NULL DEFAULT '[]'::jsonb,
    callbacks     jsonb   NOT NULL DEFAULT '{}'::jsonb,
    next_cb       integer NOT NULL DEFAULT 1
);

-- bridges (router/bridge/store.py)
CREATE SEQUENCE nsjms_bridge_id START WITH 0 MINVALUE 0;
CREATE TABLE nsjms_bridge (
    id          integer PRIMARY KEY,
    source      jsonb   NOT NULL,
    sink        jsonb   NOT NULL,
    state       text    NOT NULL CHECK (state IN ('created', 'started', 'stopped')),
    channel_id  integer NOT NULL,
    admin_id    integer,
    proxy_id    integer,
    settings    jsonb   NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
