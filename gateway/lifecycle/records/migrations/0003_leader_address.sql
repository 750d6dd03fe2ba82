-- Where the leader is reached (gateway/control/standby.py): a standby serves the
-- lifecycle API's reads from the records and passes everything else to these addresses
-- (host:port). Written with the term, in the statement that bumps it; NULL: a leader
-- that advertises none (a gateway older than this column), to which nothing is passed.
ALTER TABLE leadership ADD COLUMN http_address text, ADD COLUMN grpc_address text;
