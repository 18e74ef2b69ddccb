-- 07_partitioned.sql — a daily-partitioned outbox table, and retention that drops old days.
--
-- An alternative to 01_outbox.sql: run one or the other. On a database that already has a plain
-- public.outbox (from 01), this file only defines the functions and changes no table.
--
-- Why: `outboxd run` reads events from WAL, so rows are dead weight once written. Deleting them
-- row by row makes bloat and VACUUM work; dropping a whole day's partition is one catalog change.
-- outboxd streams inserts into any partition under the table's own name, because the publication
-- sets publish_via_partition_root = true (04_publication.sql does; outboxd creates it so too, and
-- refuses a publication that would name the partitions instead).
--
-- Keep partitions ahead of time, e.g. from cron or pg_cron, daily:
--     SELECT outbox_create_partitions(7);       -- today and the next 7 days (UTC)
--     SELECT outbox_drop_partitions(3);         -- days that ended more than 3 days ago
-- A row whose day has no partition lands in outbox_default, so writes never fail; creating a
-- partition for a day that already has rows in outbox_default fails until they are moved.
--
-- Dropping a partition never loses an event that `outboxd run` has yet to relay: the inserts
-- are in WAL, which the slot keeps. It does lose what `outboxd backfill` could re-publish, and
-- rows a poller (`outboxd poll`) has not published yet: pass only_published => true when a
-- poller relays this table, and days with unpublished rows are kept.
--
-- Safe to run more than once.

CREATE EXTENSION IF NOT EXISTS pgcrypto;

DO $do$
BEGIN
    IF to_regclass('public.outbox') IS NULL THEN
        CREATE TABLE public.outbox (
            event_id       uuid        NOT NULL DEFAULT gen_random_uuid(),
            aggregate_type text        NOT NULL,
            aggregate_id   text        NOT NULL,
            event_type     text        NOT NULL,
            payload        jsonb       NOT NULL,
            headers        jsonb       NOT NULL DEFAULT '{}'::jsonb,
            created_at     timestamptz NOT NULL DEFAULT now(),
            published_at   timestamptz,
            attempts       int         NOT NULL DEFAULT 0,
            error          text,
            -- A partitioned table's unique keys must contain the partition key.
            PRIMARY KEY (event_id, created_at)
        ) PARTITION BY RANGE (created_at);
        COMMENT ON TABLE public.outbox IS
            'Transactional outbox, partitioned by day of created_at (UTC); see sql/07_partitioned.sql.';
        CREATE TABLE public.outbox_default PARTITION OF public.outbox DEFAULT;
        CREATE INDEX outbox_unpublished_created_at_idx ON public.outbox (created_at) WHERE published_at IS NULL;
    ELSIF (SELECT relkind FROM pg_class WHERE oid = 'public.outbox'::regclass) <> 'p' THEN
        RAISE NOTICE 'public.outbox exists and is not partitioned; 07_partitioned.sql only defines its functions';
    END IF;
END
$do$;

-- Partitions public.outbox_pYYYYMMDD for today (UTC) and the next `days_ahead` days; returns the
-- names of those it created.
CREATE OR REPLACE FUNCTION public.outbox_create_partitions(days_ahead int DEFAULT 7)
RETURNS SETOF text
LANGUAGE plpgsql
AS $fn$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d     date;
    name  text;
BEGIN
    IF days_ahead < 0 THEN
        RAISE EXCEPTION 'outbox_create_partitions: days_ahead must be 0 or more, not %', days_ahead;
    END IF;
    FOR i IN 0..days_ahead LOOP
        d := today + i;
        name := 'outbox_p' || to_char(d, 'YYYYMMDD');
        IF to_regclass('public.' || name) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE public.%I PARTITION OF public.outbox FOR VALUES FROM (%L) TO (%L)',
                name,
                (d::timestamp AT TIME ZONE 'UTC'),
                ((d + 1)::timestamp AT TIME ZONE 'UTC'));
            RETURN NEXT name;
        END IF;
    END LOOP;
END
$fn$;

-- Drops the daily partitions whose whole day ended more than `keep_days` days before today (UTC);
-- returns the names of those it dropped. With only_published, a partition that still holds a row
-- with published_at IS NULL is kept (and reported in a NOTICE).
CREATE OR REPLACE FUNCTION public.outbox_drop_partitions(keep_days int, only_published boolean DEFAULT false)
RETURNS SETOF text
LANGUAGE plpgsql
AS $fn$
DECLARE
    cutoff date := (now() AT TIME ZONE 'UTC')::date - keep_days;
    part   record;
    day    date;
    waiting boolean;
BEGIN
    IF keep_days < 0 THEN
        RAISE EXCEPTION 'outbox_drop_partitions: keep_days must be 0 or more, not %', keep_days;
    END IF;
    FOR part IN
        SELECT c.relname::text AS name
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE i.inhparent = 'public.outbox'::regclass
          AND n.nspname = 'public'
          AND c.relname ~ '^outbox_p[0-9]{8}$'
        ORDER BY c.relname
    LOOP
        day := to_date(substr(part.name, 9), 'YYYYMMDD');
        -- The partition holds [day, day + 1): it is old when day + 1 <= cutoff.
        CONTINUE WHEN day + 1 > cutoff;
        IF only_published THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM public.%I WHERE published_at IS NULL)', part.name)
                INTO waiting;
            IF waiting THEN
                RAISE NOTICE 'outbox_drop_partitions: keeping % (it has unpublished rows)', part.name;
                CONTINUE;
            END IF;
        END IF;
        EXECUTE format('DROP TABLE public.%I', part.name);
        RETURN NEXT part.name;
    END LOOP;
END
$fn$;

-- Today's partitions exist from the start (no-op for a plain table: nothing to attach to).
DO $do$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'public.outbox'::regclass) = 'p' THEN
        PERFORM public.outbox_create_partitions(7);
    END IF;
END
$do$;
