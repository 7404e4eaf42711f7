-- An endpoint that answered 410 Gone is disabled for the tenant whose
-- delivery got that answer, not for every tenant. Keyed by the URL alone, one
-- tenant's 410 (an endpoint it retired, or one that answers 410 to whatever
-- it cannot verify, such as another tenant's signature) stopped every other
-- tenant's deliveries to the same URL.
ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_pkey,
    ADD COLUMN tenant_id uuid REFERENCES tenants (id) ON DELETE CASCADE;

-- An endpoint disabled before now stays disabled for every tenant whose
-- delivery to it was disabled, and only for those; one whose disabled
-- deliveries are gone stays disabled for every tenant, as it was.
INSERT INTO webhook_endpoints (url, disabled_at, reason, tenant_id)
SELECT DISTINCT ON (j.tenant_id, e.url_sha256) e.url, e.disabled_at, e.reason, j.tenant_id
  FROM webhook_endpoints e
  JOIN webhook_deliveries d ON d.url = e.url
  JOIN extractions j ON j.id = d.extraction_id
 WHERE e.tenant_id IS NULL AND d.status = 'disabled'
 ORDER BY j.tenant_id, e.url_sha256;
INSERT INTO webhook_endpoints (url, disabled_at, reason, tenant_id)
SELECT e.url, e.disabled_at, e.reason, t.id
  FROM webhook_endpoints e CROSS JOIN tenants t
 WHERE e.tenant_id IS NULL
   AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                    WHERE d.url = e.url AND d.status = 'disabled');
DELETE FROM webhook_endpoints WHERE tenant_id IS NULL;

ALTER TABLE webhook_endpoints
    ALTER COLUMN tenant_id SET NOT NULL,
    ADD CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (tenant_id, url_sha256);
