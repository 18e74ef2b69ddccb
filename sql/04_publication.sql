-- 04_publication.sql — the publication outboxd subscribes to.
--
-- Run as the owner of public.outbox (or a superuser): CREATE PUBLICATION
-- ... FOR TABLE requires table ownership.  Only INSERTs are published:
-- outboxd relays new events and ignores updates/deletes (e.g. housekeeping
-- that marks or prunes relayed rows).
--
-- Safe to run more than once: an existing publication is left as it is.

-- publish_via_partition_root (PostgreSQL 13+) makes inserts into the partitions of a partitioned
-- outbox (07_partitioned.sql) arrive under the name public.outbox, which is what outboxd routes;
-- for a plain table it changes nothing.

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'outboxd') THEN
        IF current_setting('server_version_num')::int >= 130000 THEN
            CREATE PUBLICATION outboxd FOR TABLE public.outbox
                WITH (publish = 'insert', publish_via_partition_root = true);
        ELSE
            CREATE PUBLICATION outboxd FOR TABLE public.outbox WITH (publish = 'insert');
        END IF;
    END IF;
END
$do$;
