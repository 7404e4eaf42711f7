-- What a tenant's dead letter held: the start of the refused request (its
-- JSON text), so the tenant can see what was refused without the topic.
-- Purged with the letter.
ALTER TABLE tenant_dead_letters ADD COLUMN excerpt text;
