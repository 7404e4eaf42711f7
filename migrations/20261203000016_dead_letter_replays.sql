-- `docstream dlq replay`: each replay of a dead letter, so that the same
-- letter is not replayed twice by accident (a second replay needs --force,
-- and is recorded too). The row is written before the record is produced
-- and completed with where it went; a replay that failed to produce
-- removes its row again.
CREATE TABLE dead_letter_replays (
    -- The letter: its place on the dead-letter topic.
    dlq_topic        text        NOT NULL,
    dlq_partition    integer     NOT NULL,
    dlq_offset       bigint      NOT NULL,
    -- 1 for the first replay, 2 for a forced second, …
    replay           integer     NOT NULL,
    replayed_at      timestamptz NOT NULL DEFAULT now(),
    -- Whether the operator edited the record before replaying it.
    edited           boolean     NOT NULL,
    -- Where the replayed record went (NULL until the broker acknowledged it).
    target_topic     text        NOT NULL,
    target_partition integer,
    target_offset    bigint,
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset, replay)
);
