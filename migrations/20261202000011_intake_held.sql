-- Requests from the Kafka intake whose tenant was at its cap on open jobs.
-- Retried in place, such a record held one of the consumer's in-flight slots
-- until the tenant had room, and a few hundred of them paused every
-- partition, so one tenant at its cap stalled the intake for all. Now the
-- record is delivered once its validated request is held here, and the
-- intake's releaser submits held requests, oldest first, as the tenant's jobs
-- finish. A held request is the same promise as a queued job: it is
-- submitted (once, by its idempotency key) or dead-lettered, never lost.
CREATE TABLE intake_held (
    tenant_id uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    idempotency_key text NOT NULL,
    -- The job's id and its validated request (as `extractions.request`
    -- holds it). The tenant's cap is read at release, as it is then.
    id uuid NOT NULL,
    request jsonb NOT NULL,
    -- The record it came from, named in a dead letter if it is refused later.
    source_topic text NOT NULL,
    source_partition integer NOT NULL,
    source_offset bigint NOT NULL,
    held_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, idempotency_key)
);

CREATE INDEX intake_held_oldest ON intake_held (tenant_id, held_at);
