-- An extractor's max_concurrency held across the whole deployment: one row
-- per slot, leased by the worker process making a call, as a job is by its
-- claim. A lease that is not renewed (the holder crashed or stalled) runs
-- out and the slot is taken again; the token rises with every lease, so a
-- holder whose lease ran out can neither renew nor release the slot's next
-- lease. Rows are made by the first worker to use the extractor, up to its
-- cap; a lowered cap leaves the higher slots unused.
CREATE TABLE extractor_slots (
    extractor    text        NOT NULL,
    slot         integer     NOT NULL CHECK (slot >= 0),
    holder       uuid,
    token        bigint      NOT NULL DEFAULT 0,
    leased_until timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (extractor, slot)
);

-- An extractor's requests_per_second across the deployment: when the next
-- call may start. A call takes the next start (at least now) and moves it
-- one spacing on, in one statement, so calls are spaced evenly whichever
-- worker makes them.
CREATE TABLE extractor_rates (
    extractor  text        PRIMARY KEY,
    next_start timestamptz NOT NULL
);
