-- The lifecycle's records (gateway/lifecycle/records/store.py), as the SQLite store keeps
-- them at its user_version 1: times are Unix seconds, JSON is jsonb.
CREATE TABLE jobs (
    id text PRIMARY KEY,
    model text NOT NULL,
    state text NOT NULL,
    version integer,
    steps jsonb NOT NULL DEFAULT '[]',
    error text,
    spec jsonb NOT NULL DEFAULT '{}',
    submitted_by text NOT NULL DEFAULT '',
    worker_pid integer,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    finished_at double precision
);
CREATE INDEX jobs_by_model ON jobs (model, state);
-- at most one active job per model, whoever writes: the database enforces it too
CREATE UNIQUE INDEX one_active_job_per_model ON jobs (model)
    WHERE state IN ('receiving', 'queued', 'converting', 'deploying', 'rolling_out');

CREATE TABLE versions (
    model text NOT NULL,
    version integer NOT NULL,
    state text NOT NULL,
    precision text,
    job_id text,
    config text NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}',
    report text,
    created_at double precision NOT NULL,
    reason text NOT NULL DEFAULT '',
    ended_at double precision,
    PRIMARY KEY (model, version)
);

-- per model, the highest version number ever issued: a number is never reused
CREATE TABLE version_numbers (
    model text PRIMARY KEY,
    highest integer NOT NULL
);

CREATE TABLE rollouts (
    job_id text PRIMARY KEY,
    model text NOT NULL,
    stable integer NOT NULL,
    candidate integer NOT NULL,
    spec jsonb NOT NULL,
    state text NOT NULL,
    step integer NOT NULL DEFAULT 0,
    percent integer NOT NULL DEFAULT 0,
    decisions jsonb NOT NULL DEFAULT '[]',
    detail text NOT NULL DEFAULT '',
    started_at double precision NOT NULL,
    updated_at double precision NOT NULL
);
CREATE INDEX rollouts_by_model ON rollouts (model, started_at);

CREATE TABLE models (
    name text PRIMARY KEY,
    serving_version integer,
    previous_version integer,
    pools jsonb NOT NULL DEFAULT '[]',
    keep_warm jsonb,
    state text NOT NULL,
    detail text NOT NULL DEFAULT '',
    updated_at double precision NOT NULL
);
