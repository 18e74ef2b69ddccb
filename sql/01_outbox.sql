-- 01_outbox.sql — the transactional outbox table that outboxd relays to Kafka.
--
-- Application code writes one row per domain event in the SAME transaction
-- as the business change.  outboxd never polls this table: it follows the
-- INSERTs through a pgoutput logical replication slot (see 04_publication.sql).
-- The bookkeeping columns (published_at, attempts, error) are optional and are
-- only there for operators who also want a polling fallback or manual replays.
--
-- Safe to run more than once.

CREATE EXTENSION IF NOT EXISTS pgcrypto;

CREATE TABLE IF NOT EXISTS public.outbox (
    event_id       uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,              -- e.g. 'order'; usually picks the topic
    aggregate_id   text        NOT NULL,              -- usually becomes the Kafka message key
    event_type     text        NOT NULL,              -- e.g. 'order.paid.v1'
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz,
    attempts       int         NOT NULL DEFAULT 0,
    error          text
);

COMMENT ON TABLE public.outbox IS
    'Transactional outbox: rows are streamed to Kafka by outboxd via logical replication.';

-- Rows not yet marked as published, oldest first (only useful for a fallback poller
-- or for monitoring backlog; the replication path does not need it).
CREATE INDEX IF NOT EXISTS outbox_unpublished_created_at_idx
    ON public.outbox (created_at)
    WHERE published_at IS NULL;
