-- The deployment's census sample also keeps each consumer group's lag on
-- its topic ([{"group", "topic", "lag"}]), read from outside the groups.
ALTER TABLE census_samples ADD COLUMN lag jsonb;
