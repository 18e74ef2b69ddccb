-- 04_publication.sql — the publication outboxd subscribes to.
--
-- Run as the owner of public.outbox (or a superuser): CREATE PUBLICATION
-- ... FOR TABLE requires table ownership.  Only INSERTs are published:
-- outboxd relays new events and ignores updates/deletes (e.g. housekeeping
-- that marks or prunes relayed rows).
--
-- Safe to run more than once: an existing publication is left as it is.

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'outboxd') THEN
        CREATE PUBLICATION outboxd FOR TABLE public.outbox WITH (publish = 'insert');
    END IF;
END
$do$;
