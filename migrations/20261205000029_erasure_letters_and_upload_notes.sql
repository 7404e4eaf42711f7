-- Erasing a job blanks the excerpt and reason of the tenant's dead letters
-- of its idempotency key (`store::retention::erase`): they are found by
-- tenant and key.
CREATE INDEX ix_tenant_dead_letters_key
    ON tenant_dead_letters (tenant_id, idempotency_key)
 WHERE idempotency_key IS NOT NULL;
