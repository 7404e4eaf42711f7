-- A tenant replays one of its dead letters (POST /v1/dead-letters/{id}/replay):
-- the original intake record is produced again. The row is claimed
-- (replayed_at) before the record is produced and given back if the broker
-- refuses it, so a letter is replayed once; where the copy went is kept.
ALTER TABLE tenant_dead_letters
    ADD COLUMN replayed_at      timestamptz,
    ADD COLUMN replay_partition integer,
    ADD COLUMN replay_offset    bigint;
