-- One row per leadership (gateway/lifecycle/records/leader.py): the term grows by one at
-- each acquisition; a fenced write checks it in its own transaction.
CREATE TABLE leadership (
    name text PRIMARY KEY,
    term bigint NOT NULL,
    holder text NOT NULL,
    acquired_at double precision NOT NULL
);
