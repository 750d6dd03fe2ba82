-- The control plane's own records, one row each at most (the SQLite store's user_version
-- 2): what the residency measured (gateway/residency/demand.py; written whole by the
-- leader every few seconds, read at start to preload by use) and the tenancy changed
-- through PUT/DELETE /v1/tenants (applied over the configuration file's at start;
-- document NULL: deleted, tenancy off; no row: the configuration file's).
CREATE TABLE recorded_demand (
    id smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    rates jsonb NOT NULL,  -- model -> requests per second
    saved_at double precision NOT NULL
);

CREATE TABLE tenancy_override (
    id smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    document jsonb,
    changed_at double precision NOT NULL
);
