-- The queue census (jobs by status, the oldest waiting job, open orphans by
-- class) is one periodic query per deployment, not one per process. The
-- process that moves `taken_at` forward takes this interval's turn; every
-- other process sees it fresh and skips. A row, not an advisory lock, so a
-- stopped (SIGSTOP) process cannot keep the turn: it simply stops taking it.
CREATE TABLE census_turn (
    only_row boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    taken_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO census_turn DEFAULT VALUES;
